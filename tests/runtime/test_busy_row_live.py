"""A busy row is judged as event time passes it, not once it falls quiet: through Kafka, the daemon and FalkorDB.

A row written every 200 ms for a minute of event time (a serial writer, no collision), with one lost update planted
in the middle; the messages are produced as the minute unfolds (ten times faster than real time). The lost update
is found exactly once, the entities stage commits while the row is still busy, and its pins stay bounded.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.harness import Harness
from tests.runtime.chain import MS, S, Scenario

pytestmark = pytest.mark.engines


async def test_a_row_written_every_200_ms_is_judged_while_busy(harness: Harness) -> None:
    """One planted lost update on a row that never rests: reported once, offsets committed, pins bounded."""
    base = (time.time_ns() - 90 * S) // S * S
    scenario = Scenario()
    for i in range(300):  # every 200 ms for 60 s
        scenario.serial_update(row=7, at_ns=base + i * 200 * MS, value=f"v{i}")
    scenario.lost_update(row=7, at_ns=base + 30_100 * MS)
    k = harness.settings.kafka
    cdc = f"cdc{k.group_id.rsplit('-', 1)[1]}.public.orders"
    await harness.create_topics(cdc)
    await harness.start()
    assert harness.daemon is not None
    entities = next(r for r in harness.daemon.runners if r.name == "entities")
    spans = sorted(scenario.spans)
    changes = sorted((t, key, v) for t, key, v, _ in scenario.changes)
    pinned: list[float] = []
    committed_while_busy = False
    for second in range(61):  # produce each second of event time as it happens, ten times faster
        upto = base + (second + 1) * S
        batch_spans = [v for t, v in spans if t < upto]
        spans = [(t, v) for t, v in spans if t >= upto]
        batch_changes = [(key, v) for t, key, v in changes if t < upto]
        changes = [(t, key, v) for t, key, v in changes if t >= upto]
        await harness.produce(k.spans_topic, batch_spans, key=None)
        for key, value in batch_changes:
            await harness.produce(cdc, [value], key=key)
        await asyncio.sleep(0.1)
        pinned.append(harness.metric_total("trace_repro_pinned_offsets"))
        if second > 20 and any(entities._committed.values()):
            committed_while_busy = True
    incidents = await harness.consume_all(k.incidents_topic, expect=2, timeout_s=30)
    found = [json.loads(m.value) for m in incidents]
    assert [(e["anomaly"], e["entity"]) for e in found] == [("lost_update", "orders:7")]
    assert {found[0]["culprit"]["function"], found[0]["victim"]["function"]} == {
        "shop.jobs.expire_cart", "shop.handlers.capture_payment"}  # fmt: skip
    assert committed_while_busy
    assert max(pinned) < 300  # about two judging horizons of the row, not the whole minute (600+ messages)
    await harness.wait_for(harness.drained, "drained", timeout_s=60)
