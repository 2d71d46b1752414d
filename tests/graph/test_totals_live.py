"""The CALLS and STATS edges the graph sink sums from per-partition contributions, on the real FalkorDB: each
part's latency sketch travels back as JSON text (``toJSON``), and the totals must be what one sketch of every
sample gives (not, say, bins read as counts), also when two replicas sum the same window at once."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from processors.lib.sketch import LatencySketch
from processors.model.graph import GraphBatch
from sinks.graph import schema
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter

pytestmark = pytest.mark.engines

WINDOW = {"id": "w-1", "start": 1_000.0, "end": 61_000.0}


def _sketch(samples: list[float]) -> LatencySketch:
    sketch = LatencySketch()
    for ms in samples:
        sketch.add(ms)
    return sketch


def _parts(seed: int) -> tuple[list[list[float]], LatencySketch]:
    """Two partitions' samples (different shapes, so that either alone gives other quantiles) and the sketch of all."""
    rng = random.Random(seed)
    parts = [[rng.uniform(1, 40) for _ in range(300)], [rng.uniform(30, 900) for _ in range(120)]]
    return parts, _sketch([ms for part in parts for ms in part])


async def test_calls_totals_are_the_sketch_of_every_part(sink: GraphSink) -> None:
    parts, whole = _parts(1)
    batch = GraphBatch(services=[{"name": "front"}, {"name": "back"}], windows=[WINDOW])
    for i, samples in enumerate(parts):
        batch.calls.append({"caller": "front", "callee": "back", "window": WINDOW["id"], "part": f"spans/{i}",
                            "count": len(samples), "errors": i, **_sketch(samples).to_row()})  # fmt: skip
    await sink.write_batch(batch)
    [row] = await sink.writer.query(
        "MATCH (:Service {name: 'front'})-[c:CALLS {window: $w}]->(:Service {name: 'back'}) "
        "RETURN c.count, c.errors, c.p50_ms, c.p95_ms",
        {"w": WINDOW["id"]},
    )
    assert row == [420, 1, round(whole.quantile(0.5), 3), round(whole.quantile(0.95), 3)]


async def test_stats_totals_are_the_sketch_and_the_sums_of_every_part(sink: GraphSink) -> None:
    parts, whole = _parts(2)
    batch = GraphBatch(windows=[WINDOW])
    for i, samples in enumerate(parts):
        batch.stats.append({
            "service": "shop", "operation_key": "shop:/checkout", "operation": "/checkout", "window": WINDOW["id"],
            "start": WINDOW["start"], "end": WINDOW["end"], "version": "1.0", "part": f"spans/{i}",
            "revision": "abc" if i else "", "requests": len(samples), "errors": 2 + i,
            "signatures": json.dumps({"error:/checkout:Boom": 2, "error:/checkout:Bust": i}),
            "path_ns": json.dumps({"shop": 3_000 * (i + 1), "postgresql": 1_000}),
            **_sketch(samples).to_row(),
        })  # fmt: skip
    await sink.write_batch(batch)
    [row] = await sink.writer.query(
        "MATCH (:Operation {key: 'shop:/checkout'})-[x:STATS {window: $w, version: '1.0'}]->(:Window) "
        "RETURN x.requests, x.errors, x.revision, x.p50_ms, x.p95_ms, x.p99_ms, x.signatures, x.critical_path",
        {"w": WINDOW["id"]},
    )
    assert row[:6] == [420, 5, "abc", *(round(whole.quantile(q), 3) for q in (0.5, 0.95, 0.99))]
    assert json.loads(row[6]) == {"error:/checkout:Boom": 4, "error:/checkout:Bust": 1}
    assert json.loads(row[7]) == {"postgresql": 0.1818, "shop": 0.8182}


def _calls_batch(part: int, samples: list[float]) -> GraphBatch:
    return GraphBatch(services=[{"name": "front"}, {"name": "back"}], windows=[WINDOW], calls=[
        {"caller": "front", "callee": "back", "window": WINDOW["id"], "part": f"spans/{part}",
         "count": len(samples), "errors": part + 1, **_sketch(samples).to_row()}])  # fmt: skip


def _stats_batch(part: int, samples: list[float]) -> GraphBatch:
    return GraphBatch(windows=[WINDOW], stats=[{
        "service": "shop", "operation_key": "shop:/checkout", "operation": "/checkout", "window": WINDOW["id"],
        "start": WINDOW["start"], "end": WINDOW["end"], "version": "1.0", "part": f"spans/{part}", "revision": "",
        "requests": len(samples), "errors": part + 1, "signatures": "{}", "path_ns": "{}", **_sketch(samples).to_row(),
    }])  # fmt: skip


TOTALS = {
    "calls": (_calls_batch, schema.CALLS_PARTS,
              "MATCH (:Service {name: 'front'})-[c:CALLS]->(:Service {name: 'back'}) "
              "RETURN c.count, c.errors, c.p95_ms"),
    "stats": (_stats_batch, schema.STATS_PARTS,
              "MATCH (:Operation {key: 'shop:/checkout'})-[x:STATS]->(:Window) RETURN x.requests, x.errors, x.p95_ms"),
}  # fmt: skip


@pytest.mark.parametrize("kind", TOTALS)
async def test_two_replicas_summing_in_the_losing_order_lose_no_contribution(
    sink: GraphSink, falkordb_url: str, kind: str
) -> None:
    """Two replicas write their own partition's contribution to one window and then its total. Replica A reads the
    contributions (only its own is there yet) and stops before writing the total; replica B writes its contribution
    and its total (both parts); then A writes its total. The total on the graph still adds up both contributions."""
    make, parts_query, read_total = TOTALS[kind]
    samples, whole = _parts(3)
    other = GraphSink(GraphWriter(falkordb_url, sink.writer.graph_name), clock_ms=lambda: 1.0)
    await other.start()
    summed, resume = asyncio.Event(), asyncio.Event()
    read = sink.writer.query

    async def query_then_wait(cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        rows = await read(cypher, params)
        if cypher == parts_query and not summed.is_set():
            summed.set()  # A has read the contributions to sum: B goes first from here
            await resume.wait()
        return rows

    sink.writer.query = query_then_wait  # type: ignore[method-assign]
    try:
        first = asyncio.create_task(sink.write_batch(make(0, samples[0])))
        await asyncio.wait_for(summed.wait(), 30)
        await other.write_batch(make(1, samples[1]))
        assert await other.query(read_total) == [[420, 3, round(whole.quantile(0.95), 3)]]  # B's total: both parts
        resume.set()
        await asyncio.wait_for(first, 30)
        assert await sink.query(read_total) == [[420, 3, round(whole.quantile(0.95), 3)]]
    finally:
        resume.set()
        await other.close()
