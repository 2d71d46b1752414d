"""Replicas agree with one process: CALLS and STATS summed over per-partition contributions, on the real FalkorDB.

Two ingest stages, each owning one partition of the spans topic, write what one stage owning both writes; a replica
replaying its partition (after a crash) changes nothing.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from sinks.graph import GraphSink, GraphWriter
from streamer import config
from streamer.components import default
from streamer.decode.registry import Record
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from tests.fake_clock import FakeClock
from tests.otlp_factory import ShopTelemetry, to_proto

pytestmark = pytest.mark.engines

S = 1_000_000_000
MS = 1_000_000
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"
ENV = {"TRACE_REPRO_WINDOWS__WINDOW_S": "10", "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "1",
       "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0", "TRACE_REPRO_WINDOWS__IDLE_S": "2"}  # fmt: skip


def _traffic(t0: int) -> dict[int, list[bytes]]:
    """Spans messages per partition: requests of two services over three windows, some failing, some slow."""
    out: dict[int, list[bytes]] = {0: [], 1: []}
    for i in range(60):
        shop = ShopTelemetry(version="1.0" if i % 3 else "1.1")
        shop.request(f"/orders/{i % 4}", statements=[(UPDATE, f"('paid', {i})")], error=i % 7 == 0,
                     function="capture_payment", start_ns=t0 + i * 400 * MS + (i % 5) * 37 * MS)  # fmt: skip
        out[i % 2].append(to_proto(shop.take()))
    return out


async def _run(stage_parts: list[list[int]], traffic: dict[int, list[bytes]], graph: GraphSink, t0: int) -> None:
    """One ingest stage per entry, owning those partitions; every batch written as the runner would."""
    settings = config.load(None, env=ENV)
    for parts in stage_parts:
        clock, metrics, tracker = FakeClock(t0), Metrics(), PinTracker()
        procs = stage_processors(settings, metrics, clock, "ingest", tracker, default().factories)
        stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=procs)
        stage.assign([("otlp_spans", p) for p in parts])
        # interleaved as a consumer fetches them: both partitions progress together
        records = [Record("otlp_spans", p, n, None, traffic[p][n]) for n in range(60) for p in parts
                   if n < len(traffic[p])]  # fmt: skip
        for i in range(0, len(records), 7):
            clock.now = t0 + 30 * S
            out = stage.process(records[i : i + 7])
            await graph.write_batch(out.graph)
        for _ in range(10):  # idle: every window closes
            clock.advance(5)
            out = stage.process([])
            await graph.write_batch(out.graph)


def _graph(falkordb_url: str) -> GraphSink:
    url = falkordb_url
    return GraphSink(GraphWriter(url, f"replicas_{uuid.uuid4().hex[:8]}"), clock_ms=lambda: time.time() * 1000)


async def _totals(graph: GraphSink) -> Any:
    calls = await graph.query("MATCH (a)-[c:CALLS]->(b) RETURN a.name, b.name, c.window, c.count, c.errors, "
                              "c.p50_ms, c.p95_ms ORDER BY a.name, b.name, c.window")  # fmt: skip
    stats = await graph.query("MATCH (o:Operation)-[x:STATS]->(w:Window) RETURN o.key, x.window, x.version, "
                              "x.requests, x.errors, x.error_rate, x.p50_ms, x.p95_ms, x.signatures, x.critical_path "
                              "ORDER BY o.key, x.window, x.version")  # fmt: skip
    return calls, stats


async def test_two_replicas_write_what_one_process_writes_and_a_replay_changes_nothing(falkordb_url: str) -> None:
    """CALLS and STATS totals are equal whether one stage owned both partitions or two replicas one each; a replica
    that replays its partition rewrites its own contributions and the totals stay."""
    t0 = (time.time_ns() // (10 * S) - 20) * 10 * S
    traffic = _traffic(t0)
    one, two = _graph(falkordb_url), _graph(falkordb_url)
    for g in (one, two):
        await g.start()
    try:
        await _run([[0, 1]], traffic, one, t0)
        await _run([[0], [1]], traffic, two, t0)
        single = await _totals(one)
        replicas = await _totals(two)
        assert single[0] and single[1]
        assert replicas == single
        calls = {(r[0], r[1]): 0 for r in single[0]}
        for r in single[0]:
            calls[(r[0], r[1])] += r[3]
        assert calls[("checkout", "postgresql")] == 60  # every request counted once, over both partitions
        await _run([[0]], traffic, two, t0)  # replica 0 replays its partition from the start
        assert await _totals(two) == single
    finally:
        for g in (one, two):
            await g.writer._graph.delete()
            await g.close()
