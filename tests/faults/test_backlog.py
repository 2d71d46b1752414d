"""The control for the fault tests: the same backlog and the same planted lost updates, and no fault at all.

The daemon starts on a backlog (spans and Debezium row changes already on Kafka, as after any restart or
deploy) and works through it. Every trace and span must reach the graph exactly once, and every planted lost update
must be reported once, with both of its row changes and the value it lost: the row changes are on Kafka as early as
the spans, so event time must wait for them before a row is judged. A failure here that the fault tests also show
is not caused by the fault.
"""

from __future__ import annotations

import time

import pytest

from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    MS,
    ROOT_LAG,
    Traffic,
    assert_graph_exactly_once,
    assert_graph_occurrences_once,
    assert_incidents_carry_row_changes,
    assert_incidents_once,
    cdc_topic,
    fault_harness,
    incident_events,
    produce,
    wait_all,
    wait_committed_past,
)

pytestmark = pytest.mark.engines

REQUESTS = 240
COLLISIONS = 8
STEP_MS = 20.0


async def test_backlog_without_fault_reports_each_collision_once_with_its_row_changes(healthy: LocalEngines) -> None:
    """A backlog read from offset 0: every trace and span once, every planted lost update once and manifest."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    h = fault_harness(kafka, falkordb, kafka__max_poll_records="4")
    k = h.settings.kafka
    traffic = Traffic(k.spans_topic, cdc_topic(h), root_lag=ROOT_LAG)
    expected = traffic.expected
    try:
        await h.create_topics(k.spans_topic, cdc_topic(h))
        await produce(kafka, traffic.stream(REQUESTS, COLLISIONS, step_ms=STEP_MS,
                                            start_ns=time.time_ns() - int(REQUESTS * STEP_MS * MS)))  # fmt: skip
        await h.start()
        planted = len(expected.planted)
        await wait_all(h, expected, "every trace and incident", 60)
        await wait_committed_past(h, "every stage committed past its input")
        events = incident_events(await h.consume_all(k.incidents_topic, expect=planted + 1, timeout_s=4))

        assert_graph_exactly_once(h, expected)
        assert_incidents_once(events, expected)
        assert_graph_occurrences_once(h, events)
        assert_incidents_carry_row_changes(events)
    finally:
        await h.stop()
