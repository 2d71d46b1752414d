"""The proof judge across replicas and restarts: per-partition contributions on the real FalkorDB add up.

The proof scenario's traffic (tests/regressions/test_proof_judge.py) is split over two input partitions. Two judges,
each counting one partition and loading the other's contributions from the graph, give the verdicts one judge
counting both gives; a judge restarted half-way, loading what it had written, gives them too.
"""

from __future__ import annotations

import heapq
import time
import uuid

import pytest

from processors.connectors.proofs.desk import contribution_of, contribution_row
from processors.connectors.proofs.judge import ProofJudge
from processors.model.outputs import VerdictEvent
from processors.model.trace import ClosedTrace
from sinks.graph import GraphSink, GraphWriter, schema
from tests.regressions.builders import MS, T0, S
from tests.regressions.test_proof_judge import CONTRACT, Feed, build

pytestmark = pytest.mark.engines


def _items() -> list[tuple[int, int, object]]:
    """The scenario's input in event-time order, each trace given a partition (alternating)."""
    feed = Feed(ProofJudge())
    both = ("even", "custom")
    build(feed, "1.0", T0, 200, buggy=both)
    build(feed, "1.1", T0 + 100 * S, 200, buggy=("custom",), fixed=("even",))
    build(feed, "1.2", T0 + 200 * S, 200, fixed=both)
    build(feed, "1.3", T0 + 300 * S, 200, fixed=both, broken=("custom",))
    items = []
    while feed.items:
        at, seq, item = heapq.heappop(feed.items)
        if isinstance(item, ClosedTrace):
            item = ClosedTrace(item.trace_id, item.spans, part=f"otlp_spans/{seq % 2}")
        items.append((at, seq, item))
    return items


def _feed(judge: ProofJudge, item: object) -> None:
    if isinstance(item, ClosedTrace):
        judge.on_trace(item)
    else:
        judge.on_log(item, f"otlp_logs/{0}")  # type: ignore[arg-type]


def _outcomes(verdicts: list[VerdictEvent]) -> list[tuple[str, str, int, int, int, int]]:
    """Verdicts as every sink keeps them: the first of each event id (a restarted judge may say one again)."""
    first: dict[str, VerdictEvent] = {}
    for v in verdicts:
        first.setdefault(v.event_id, v)
    return sorted((v.version, v.outcome, v.receipt.before_errors, v.receipt.before_requests,
                   v.receipt.after_errors, v.receipt.after_requests) for v in first.values())  # fmt: skip


async def _exchange(graph: GraphSink, judges: list[ProofJudge]) -> None:
    """Each judge writes its changed contributions, then loads everyone's (as the desk does between batches)."""
    for judge in judges:
        rows = [contribution_row(key, c, time.time() * 1000) for key, c in judge.contributions()]
        if rows:
            await graph.writer.write_rows("tallies", schema.UPSERTS["tallies"], rows)
    stored = await graph.tallies_since(0)
    for judge in judges:
        judge.load([((r["service"], r["version"], r["part"]), contribution_of(r)) for r in stored])


async def _run(graph: GraphSink, owners: list[set[str]], *, restart_at_ns: int | None = None) -> list[VerdictEvent]:
    """Judges owning the given partitions; every 5 s of event time they settle, exchange, then judge."""
    judges = [ProofJudge(settle_ns=0) for _ in owners]
    for judge in judges:
        judge.on_contract(CONTRACT)
    items = _items()
    out: list[VerdictEvent] = []
    watermark = T0
    while watermark <= T0 + 420 * S:
        if restart_at_ns is not None and watermark >= restart_at_ns:
            judges = [ProofJudge(settle_ns=0) for _ in owners]  # a restart: nothing in memory
            for judge in judges:
                judge.on_contract(CONTRACT)
            await _exchange(graph, judges)  # the desk's first sync loads what was written
            restart_at_ns = None
        while items and items[0][0] <= watermark:
            _, _, item = items.pop(0)
            part = item.part if isinstance(item, ClosedTrace) else "otlp_logs/0"
            for judge, parts in zip(judges, owners, strict=True):
                if part in parts:
                    _feed(judge, item)
        for judge in judges:
            judge.ledger.settle(watermark)
        await _exchange(graph, judges)
        for judge in judges:
            out += judge.close_until(watermark)
        watermark += 5 * S
    return out


@pytest.fixture
async def graph(falkordb_url: str) -> GraphSink:
    sink = GraphSink(GraphWriter(falkordb_url, f"judges_{uuid.uuid4().hex[:8]}"), clock_ms=lambda: time.time() * 1000)
    await sink.start()
    return sink


async def test_two_replicas_judge_as_one_process(falkordb_url: str) -> None:
    """One judge counting both partitions and two judges counting one each (sharing contributions through the
    graph) give the same verdicts with the same receipts; each replica gives them."""
    graphs = []
    for _ in range(2):
        g = GraphSink(GraphWriter(falkordb_url, f"judges_{uuid.uuid4().hex[:8]}"), clock_ms=lambda: time.time() * 1e3)
        await g.start()
        graphs.append(g)
    try:
        everything = {"otlp_spans/0", "otlp_spans/1", "otlp_logs/0"}
        single = _outcomes(await _run(graphs[0], [everything]))
        assert [o[:2] for o in single] == [("1.1", "NOT_FIXED"), ("1.2", "FIXED"), ("1.3", "WORSE")]
        replicas = await _run(graphs[1], [{"otlp_spans/0", "otlp_logs/0"}, {"otlp_spans/1"}])
        assert _outcomes(replicas) == single
        assert len(replicas) == 2 * len(single)  # both replicas judged (the sinks deduplicate by event id)
    finally:
        for g in graphs:
            await g.writer._graph.delete()
            await g.close()


async def test_a_restarted_judge_resumes_with_what_it_had_counted(graph: GraphSink) -> None:
    """A judge restarted half-way (its memory lost) loads its contributions from the graph and gives the same
    verdicts as one that never stopped."""
    try:
        everything = [{"otlp_spans/0", "otlp_spans/1", "otlp_logs/0"}]
        restarted = _outcomes(await _run(graph, everything, restart_at_ns=T0 + 150 * S + 3 * MS))
        assert [o[:2] for o in restarted] == [("1.1", "NOT_FIXED"), ("1.2", "FIXED"), ("1.3", "WORSE")]
        assert [o for o in restarted if o[0] == "1.2"] == [("1.2", "FIXED", 10, 200, 0, 100)]
    finally:
        await graph.writer._graph.delete()
        await graph.close()
