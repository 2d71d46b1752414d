"""The ``paths`` detail policy on the real FalkorDB: what each reader of Span nodes reads is there.

Readers of Span nodes (every Cypher that matches ``:Span``, in ``sinks.graph.schema``): an incident's ``CULPRIT`` /
``VICTIM`` (access spans, by id), the repro worker's ``TABLE_SITES`` (access spans' READ/WROTE edges, their
statement and service), retention (``EXPIRE``, by ``s.end``). The judge and the regression detector's critical path
work on tallies and on the closed traces in memory, and GitLab bodies on the events, not on Span nodes.
"""

from __future__ import annotations

from typing import Any

import pytest

from processors.graph.rows import omitted_spans, trace_rows
from processors.model.events import Access
from processors.model.graph import GraphBatch
from processors.model.outputs import IncidentEvent
from processors.model.trace import ClosedTrace
from sinks.graph.sink import GraphSink
from tests.graph.checkout_request import UPDATE, info, span, update_of

pytestmark = pytest.mark.engines


def request(tid: str, base: int) -> tuple[ClosedTrace, Access]:
    """server -> handler -> {render -> template, auth, db UPDATE}: the DB span writes orders:8812. Spans are listed
    children first, so the graph cannot rely on parents coming first."""
    spans = (
        span(tid, base + 6, base + 2, "db", db=True), span(tid, base + 5, base + 3, "template"),
        span(tid, base + 3, base + 2, "render"), span(tid, base + 4, base + 2, "auth"),
        span(tid, base + 2, base + 1, "capture_payment"), span(tid, base + 1, 0, "POST /orders/{id}/capture"),
    )  # fmt: skip
    return ClosedTrace(tid, spans), update_of(spans[0])


async def _count(sink: GraphSink, cypher: str) -> int:
    return int((await sink.query(cypher))[0][0])


async def test_incident_spans_their_ancestors_and_table_sites_are_in_the_graph(sink: GraphSink) -> None:
    """Two colliding requests under ``paths``: each access span and its ancestors to the root are Span nodes with
    their properties, OF and CHILD_OF edges; the other spans are the Trace's ``omitted`` summary; the incident's
    culprit and victim are those span nodes (not placeholders); the repro worker's table sites find the code site."""
    culprit, a = request("a" * 32, 10)
    victim, b = request("b" * 32, 20)
    batch = GraphBatch()
    trace_rows(culprit, [a], "paths", batch)
    trace_rows(victim, [b], "paths", batch)
    await sink.write_batch(batch)

    assert await _count(sink, "MATCH (s:Span) RETURN count(s)") == 6  # db, handler, root per trace
    assert await _count(sink, "MATCH (:Span)-[:OF]->(:Trace) RETURN count(*)") == 6
    assert await _count(sink, "MATCH (:Span)-[:CHILD_OF]->(:Span) RETURN count(*)") == 4
    chain = await sink.query(
        "MATCH p = (s:Span {id: $id})-[:CHILD_OF*]->(r:Span) WHERE r.kind = 'server' "
        "RETURN [n IN nodes(p) | n.name], r.route",
        {"id": a.span_id},
    )  # fmt: skip
    assert chain == [[["db", "capture_payment", "POST /orders/{id}/capture"], "/orders/{id}/capture"]]
    [[omitted]] = await sink.query("MATCH (t:Trace {id: $id}) RETURN t.omitted", {"id": "a" * 32})
    assert [(o["name"], o["service"], o["duration_ms"]) for o in omitted_spans(omitted)] == [
        ("render", "checkout", 50.0), ("auth", "checkout", 50.0), ("template", "checkout", 50.0),
    ]  # fmt: skip

    incident = IncidentEvent(fingerprint="fp", occurrence="o1", anomaly="lost_update", severity="high",
                             manifest=True, entity="orders:8812", table="orders", window_ms=2.0, summary="lost",
                             damage="", confidence=0.9, culprit=info(a), victim=info(b), writers=[info(a), info(b)],
                             accesses=[info(a), info(b)], commits=[], evidence=[],
                             detected_at_unix_ms=1.0)  # fmt: skip
    await sink.record([incident])
    rows = await sink.query(
        "MATCH (i:Incident {fingerprint: 'fp'})-[r:CULPRIT|VICTIM]->(s:Span)-[:OF]->(t:Trace) "
        "MATCH (s)-[w:WROTE]->(:Entity {key: 'orders:8812'}) "
        "RETURN type(r), t.id, s.statement, w.function ORDER BY type(r)"
    )  # fmt: skip
    assert rows == [["CULPRIT", "a" * 32, UPDATE, "capture_payment"], ["VICTIM", "b" * 32, UPDATE, "capture_payment"]]
    assert await _count(sink, "MATCH (s:Span) RETURN count(s)") == 6  # no placeholder span was created
    assert await sink.table_sites("orders") == [("capture_payment", "shop/pay.py", UPDATE, "none", "checkout")]


async def test_replay_and_a_late_fragment_change_nothing_they_should_not(sink: GraphSink) -> None:
    """The same trace written twice is the same graph; a late unrooted fragment neither replaces the summary nor
    the root, and its own kept spans join the trace."""
    t, a = request("c" * 32, 30)
    batch = GraphBatch()
    trace_rows(t, [a], "paths", batch)
    await sink.write_batch(batch)
    await sink.write_batch(batch)
    counts = "MATCH (s:Span) WITH count(s) AS s MATCH ()-[e]->() RETURN s, count(e)"
    before = await sink.query(counts)
    assert before[0][0] == 3
    [[summary, root]] = await sink.query("MATCH (t:Trace) RETURN t.omitted, t.root")
    late = ClosedTrace("c" * 32, (span("c" * 32, 40, 32, "retry", error=True), span("c" * 32, 41, 32, "log")),
                       late=True)  # fmt: skip
    batch = GraphBatch()
    trace_rows(late, [], "paths", batch)
    await sink.write_batch(batch)
    assert await sink.query("MATCH (t:Trace) RETURN t.omitted, t.root, t.status") == [[summary, root, "error"]]
    assert await _count(sink, "MATCH (s:Span {name: 'retry'})-[:OF]->(:Trace) RETURN count(s)") == 1
    assert await _count(sink, "MATCH (s:Span) RETURN count(s)") == 4


@pytest.mark.parametrize("policy", ["paths", "all"])
@pytest.mark.parametrize("root_first", [False, True], ids=["children_first", "root_first"])
async def test_a_trace_written_in_fragments_links_every_span_to_its_parent(
    sink: GraphSink, policy: str, root_first: bool
) -> None:
    """A trace that closed before its root arrived (a long request, a pause, a rebalance) is written in two
    fragments, in either order: every CHILD_OF edge is in the graph once both are, and no span still waits."""
    t, a = request("d" * 32, 50)
    children = ClosedTrace(t.trace_id, t.spans[:4])  # db, template, render, auth: their parents come later
    root = ClosedTrace(t.trace_id, t.spans[4:], late=True)  # capture_payment and the server span
    fragments = [(root, []), (children, [a])] if root_first else [(children, [a]), (root, [])]
    for fragment, accesses in fragments:
        batch = GraphBatch()
        trace_rows(fragment, accesses, policy, batch)
        await sink.write_batch(batch)
    edges = await sink.query("MATCH (c:Span)-[:CHILD_OF]->(p:Span) RETURN c.name, p.name ORDER BY c.name")
    want = {("db", "capture_payment"), ("capture_payment", "POST /orders/{id}/capture")}
    if policy == "all":
        want |= {("template", "render"), ("render", "capture_payment"), ("auth", "capture_payment")}
    if policy == "paths" and root_first:
        want = set()  # a root fragment first and untouched by rows is not detail; the children never get parents
    assert {(c, p) for c, p in edges} == want
    assert len(edges) == len(want)
    waiting = await sink.query("MATCH (s:Span) WHERE s.awaiting_parent IS NOT NULL RETURN s.name")
    assert waiting == ([["db"]] if policy == "paths" and root_first else [])
    if want:
        assert await sink.query("MATCH (t:Trace) RETURN t.root") == [["/orders/{id}/capture"]]


async def test_a_late_fragment_the_policy_would_not_detail_never_starts_a_trace(sink: GraphSink) -> None:
    """Under ``paths`` a late fragment touching no row completes a trace already in the graph, never starts one."""
    t, _ = request("e" * 32, 60)
    batch = GraphBatch()
    trace_rows(ClosedTrace(t.trace_id, t.spans[4:], late=True), [], "paths", batch)
    assert batch.late_traces and not batch.traces
    await sink.write_batch(batch)
    assert await _count(sink, "MATCH (n) WHERE n:Trace OR n:Span RETURN count(n)") == 0


@pytest.mark.parametrize("policy", ["paths", "all"])
async def test_a_replay_after_a_crash_between_the_upserts_and_the_adoption_leaves_no_span_waiting(
    sink: GraphSink, policy: str
) -> None:
    """The children's fragment is written (its spans wait for their parents), then the root's upserts, and the
    daemon dies before the adoption that follows them; the input is replayed from the last commit, both fragments:
    every CHILD_OF edge is in the graph once, and no span still waits (the upserts set ``awaiting_parent`` only on
    a span whose parent is missing; the adoption after each batch links and clears the others)."""
    t, a = request("e" * 32, 60)
    children = GraphBatch()
    trace_rows(ClosedTrace(t.trace_id, t.spans[:4]), [a], policy, children)
    root = GraphBatch()
    trace_rows(ClosedTrace(t.trace_id, t.spans[4:], late=True), [], policy, root)
    await sink.write_batch(children)
    waiting = "MATCH (s:Span) WHERE s.awaiting_parent IS NOT NULL RETURN s.name ORDER BY s.name"
    assert await sink.query(waiting) == ([["db"]] if policy == "paths" else [["auth"], ["db"], ["render"]])
    await sink.writer.upsert(root)  # without the adoption that write() runs after it
    await sink.write_batch(children)  # the replay
    await sink.write_batch(root)
    edges = await sink.query("MATCH (c:Span)-[:CHILD_OF]->(p:Span) RETURN c.name, p.name ORDER BY c.name")
    want = [["capture_payment", "POST /orders/{id}/capture"], ["db", "capture_payment"]]
    if policy == "all":
        want += [["auth", "capture_payment"], ["render", "capture_payment"], ["template", "render"]]
    assert edges == sorted(want)
    assert await sink.query(waiting) == []


async def test_a_span_named_twice_in_one_statement_is_written_once_and_nothing_is_refused(sink: GraphSink) -> None:
    """Spans new to the graph are created, not merged (``schema.traces``): a statement whose rows name one span
    twice (a trace in two rows of one batch, a span delivered twice) is written in the form that merges them, so
    the graph holds each span once and refuses no row (a second CREATE would break the span's unique key)."""
    t, a = request("f" * 32, 70)
    batch = GraphBatch()
    trace_rows(t, [a], "paths", batch)
    trace_rows(t, [a], "paths", batch)
    u, b = request("9" * 32, 80)
    twice = GraphBatch()
    trace_rows(u, [b], "paths", twice)
    row = twice.traces[0]
    row["spans"] = [*row["spans"], row["spans"][0]]  # its first kept span, delivered twice
    dead: list[Any] = []
    await sink.write_batch(batch, dead)
    await sink.write_batch(twice, dead)
    assert dead == []
    assert await _count(sink, "MATCH (s:Span) RETURN count(s)") == 3 + 3
    assert await _count(sink, "MATCH (:Span)-[:OF]->(:Trace) RETURN count(*)") == 3 + 3
    assert await _count(sink, "MATCH (:Span)-[:CHILD_OF]->(:Span) RETURN count(*)") == 2 + 2
