"""Trace rows whose spans are all new to the graph (``schema.traces.FRESH``) on the real FalkorDB: the graph they
leave is the one the lookup form leaves, with rows of spans already there in the same statement, parents in other
rows and parents not there yet; and a span another writer creates between the writer's read and its write refuses
no row."""

from __future__ import annotations

import contextlib
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from falkordb import FalkorDB

from processors.graph.rows import trace_rows
from processors.model.graph import GraphBatch
from processors.model.trace import ClosedTrace
from sinks.graph import schema
from sinks.graph.rows import linked
from sinks.graph.schema import traces
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter
from tests.graph.checkout_request import span, update_of

pytestmark = pytest.mark.engines


def _request(tid: str, base: int) -> ClosedTrace:
    """server -> handler -> {render -> template, auth, db}: children listed first."""
    return ClosedTrace(tid, (
        span(tid, base + 6, base + 2, "db", db=True), span(tid, base + 5, base + 3, "template"),
        span(tid, base + 3, base + 2, "render"), span(tid, base + 4, base + 2, "auth"),
        span(tid, base + 2, base + 1, "capture_payment"), span(tid, base + 1, 0, "POST /orders/{id}/capture"),
    ))  # fmt: skip


def _batches() -> list[GraphBatch]:
    """A trace written, then a batch with its replay, a new trace, another written in two fragments (the
    children's row before the root's, in one statement), and a fragment of a trace written before whose span's
    parent is in the graph already (each fragment with a write, so that it is detailed)."""
    a, b, c = _request("a" * 32, 10), _request("b" * 32, 20), _request("c" * 32, 30)
    d = _request("d" * 32, 40)
    first, second = GraphBatch(), GraphBatch()
    trace_rows(a, [update_of(a.spans[0])], "paths", first)
    trace_rows(ClosedTrace(d.trace_id, d.spans[4:]), [update_of(d.spans[4])], "paths", first)  # capture, server
    trace_rows(a, [update_of(a.spans[0])], "paths", second)
    trace_rows(b, [update_of(b.spans[0])], "paths", second)
    trace_rows(ClosedTrace(c.trace_id, c.spans[:4]), [update_of(c.spans[0])], "paths", second)
    trace_rows(ClosedTrace(c.trace_id, c.spans[4:], late=True), [], "paths", second)
    trace_rows(ClosedTrace(d.trace_id, d.spans[:1], late=True), [update_of(d.spans[0])], "paths", second)  # db
    return [first, second]


@pytest.fixture
async def graphs(falkordb_url: str) -> AsyncIterator[tuple[str, list[str]]]:
    names = [f"fresh_{uuid.uuid4().hex[:8]}" for _ in range(2)]
    yield falkordb_url, names
    host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
    for name in names:
        with contextlib.suppress(Exception):  # never created
            FalkorDB(host=host, port=int(port)).select_graph(name).delete()


async def _digest(sink: GraphSink) -> tuple[str, list[list[Any]]]:
    nodes = await sink.query("MATCH (n) RETURN labels(n), properties(n)")
    edges = await sink.query(
        "MATCH (n)-[x]->(m) RETURN coalesce(n.id, n.key, n.name), type(x), properties(x), coalesce(m.id, m.key, m.name)"
    )
    lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in nodes + edges)
    kinds = await sink.query("MATCH ()-[x]->() RETURN type(x), count(x) ORDER BY type(x)")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest(), kinds


def test_linked_rows_name_each_parent_by_its_place_in_the_row() -> None:
    row = ["t", "/", "svc", 1, 2, "ok", "1", True, None, [["c", "p", "x"], ["p", None, "y"], ["o", "gone", "z"]]]
    assert linked([row, row], empty=True) == (
        [[*row[:9], [["c", None, "x", 1], ["p", None, "y", -1], ["o", "gone", "z", -1]], n] for n in (0, 1)],
        [True, True],  # "o" names a parent that is not in the row
    )
    assert linked([[*row[:9], row[9][:2]]], empty=True)[1] == [False]


async def test_rows_of_new_spans_leave_the_graph_the_lookup_form_leaves(graphs: tuple[str, list[str]]) -> None:
    url, names = graphs
    digests = []
    for name, fresh in zip(names, (True, False), strict=True):
        writer = GraphWriter(url, name)
        writer.create_fresh = fresh
        statements: list[str] = []
        adopted: list[str] = []  # the traces ADOPT looked at
        query = writer._statement

        async def noted(op: str, statement: str, rows: Any, *args: Any, _query: Any = query,
                        _out: tuple[list[str], list[str]] = (statements, adopted), **kwargs: Any) -> None:  # fmt: skip
            _out[0].append(statement)
            if statement == schema.ADOPT:
                _out[1].extend(rows)
            try:
                await _query(op, statement, rows, *args, **kwargs)
            except Exception:
                _out[0].append("refused")
                raise

        writer._statement = noted  # type: ignore[method-assign]
        sink = GraphSink(writer, clock_ms=lambda: 1.0)
        await sink.start()
        try:
            dead: list[Any] = []
            for batch in _batches():
                await sink.write_batch(batch, dead)
            assert dead == []
            digests.append(await _digest(sink))
            waiting = await sink.query("MATCH (s:Span) WHERE s.awaiting_parent IS NOT NULL RETURN count(s)")
            assert waiting == [[0]]
        finally:
            await sink.close()
        # the read found every span there (the replay's: its trace is there): no statement was refused
        assert "refused" not in statements
        # the form under test was the one written: new traces CREATEd, the late fragment's Trace matched
        assert (traces.CREATED in statements) is (traces.FRESH["late_traces"] in statements) is fresh
        # Adopted: the replay (its spans were there), the traces in fragments (a new trace's fragment whose parents
        # are in another row, a fragment of a trace already there, whose new spans wait for their parents until
        # ADOPT links them); a new trace whose parents are in its row is not.
        assert sorted(adopted) == (["a" * 32] * (1 if fresh else 2) + ["b" * 32] * (0 if fresh else 1) + ["c" * 32]
                                   + ["d" * 32] * (1 if fresh else 2))  # fmt: skip
    assert digests[0] == digests[1]
    # each trace's kept path (db -> capture_payment -> server): OF and CHILD_OF; the DB spans' writes, the route;
    # and the trace in two detailed fragments: the same path, a write from each fragment
    assert digests[0][1] == [["CHILD_OF", 4 * 2], ["EXPOSES", 1], ["OF", 4 * 3], ["WROTE", 3 + 2]]


async def test_a_span_another_writer_makes_after_the_read_refuses_no_row(graphs: tuple[str, list[str]]) -> None:
    """Between the writer's read of which spans are there and its write, a row change makes a placeholder of one
    span (``changes``): the unique constraint refuses the statement that creates it, and the rows are written with
    the lookup form: the placeholder becomes the span, every edge is there once, nothing is dead-lettered."""
    url, names = graphs
    writer = GraphWriter(url, names[0])
    t = _request("d" * 32, 40)
    query = writer._statement
    refused: list[str] = []

    async def racing(op: str, statement: str, *args: Any, **kwargs: Any) -> None:
        if statement in (traces.FRESH["traces"], traces.CREATED):
            await writer.query("MERGE (s:Span {id: $id}) ON CREATE SET s.seen = 1", {"id": t.spans[4].span_id})
            try:
                await query(op, statement, *args, **kwargs)
            except Exception as exc:
                refused.append(type(exc).__name__)
                raise
            return
        await query(op, statement, *args, **kwargs)

    writer._statement = racing  # type: ignore[method-assign]
    sink = GraphSink(writer, clock_ms=lambda: 1.0)
    await sink.start()
    try:
        batch = GraphBatch()
        trace_rows(t, [update_of(t.spans[0])], "paths", batch)
        dead: list[Any] = []
        assert await sink.write_batch(batch, dead) >= 1
        assert dead == [] and refused == ["Refused"]
        counts = await sink.query(
            "MATCH (s:Span) OPTIONAL MATCH (s)-[o:OF]->(:Trace) WITH s, count(o) AS o "
            "OPTIONAL MATCH (s)-[c:CHILD_OF]->(:Span) RETURN count(s), sum(o), count(c), "
            "sum(CASE WHEN s.name IS NULL THEN 1 ELSE 0 END)"
        )
        assert counts == [[3, 3, 2, 0]]  # the kept path: db -> capture_payment (the placeholder) -> server
    finally:
        await sink.close()


async def _written_without_refusal(url: str, name: str, batches: list[GraphBatch], before: str = "",
                                   **params: Any) -> list[list[Any]]:  # fmt: skip
    """Write ``batches`` (after the statement ``before``) and return the kept spans' counts: spans, OF edges,
    CHILD_OF edges, spans without a name; asserts that no statement was refused and no row went dead."""
    writer = GraphWriter(url, name)
    query = writer._statement
    refused: list[str] = []

    async def noting(op: str, statement: str, *args: Any, **kwargs: Any) -> None:
        try:
            await query(op, statement, *args, **kwargs)
        except Exception as exc:
            refused.append(type(exc).__name__)
            raise

    writer._statement = noting  # type: ignore[method-assign]
    sink = GraphSink(writer, clock_ms=lambda: 1.0)
    await sink.start()
    try:
        if before:
            await writer.query(before, params)
        dead: list[Any] = []
        for batch in batches:
            assert await sink.write_batch(batch, dead) >= 1
        assert dead == [] and refused == []
        return await sink.query(
            "MATCH (s:Span) OPTIONAL MATCH (s)-[o:OF]->(:Trace) WITH s, count(o) AS o "
            "OPTIONAL MATCH (s)-[c:CHILD_OF]->(:Span) RETURN count(s), sum(o), count(c), "
            "sum(CASE WHEN s.name IS NULL THEN 1 ELSE 0 END)"
        )
    finally:
        await sink.close()


async def test_a_placeholder_of_an_access_span_made_before_its_trace_is_found_by_the_read(
    graphs: tuple[str, list[str]],
) -> None:
    """A row change credited to the DB span before its trace is written makes a placeholder of it: the writer's read
    finds it (an access span of the batch) and its row is written the lookup way, nothing refused, nothing dead."""
    url, names = graphs
    t = _request("e" * 32, 50)
    batch = GraphBatch()
    trace_rows(t, [update_of(t.spans[0])], "paths", batch)
    placeholder = "MERGE (s:Span {id: $id}) ON CREATE SET s.seen = 1"
    counts = await _written_without_refusal(url, names[0], [batch], placeholder, id=t.spans[0].span_id)
    assert counts == [[3, 3, 2, 0]]  # the kept path: db (the placeholder) -> capture_payment -> server


async def test_a_replayed_fragment_without_access_spans_is_found_by_the_read(graphs: tuple[str, list[str]]) -> None:
    """A late fragment with no access span, written again (a replay): its trace is in the graph, so the read looks
    its spans up and finds them; the row is written the lookup way, nothing refused."""
    url, names = graphs
    t = _request("f" * 32, 60)
    batches = [GraphBatch(), GraphBatch(), GraphBatch()]
    trace_rows(ClosedTrace(t.trace_id, t.spans[:4]), [update_of(t.spans[0])], "paths", batches[0])
    for batch in batches[1:]:
        trace_rows(ClosedTrace(t.trace_id, t.spans[4:], late=True), [], "paths", batch)
    counts = await _written_without_refusal(url, names[0], batches)
    assert counts == [[3, 3, 2, 0]]  # the first fragment's kept db span, the late one's capture_payment and server


async def test_a_new_traces_span_whose_parent_is_only_a_placeholder_gets_its_edge(
    graphs: tuple[str, list[str]],
) -> None:
    """The first fragment of a trace holds the DB span, not its parent, which is in the graph only as a placeholder
    (an incident named it): the span is created waiting for it and the adoption after the batch links it (the
    statement of new spans looks no parent up), nothing refused, nothing dead."""
    url, names = graphs
    t = _request("9" * 32, 70)
    batch = GraphBatch()
    trace_rows(ClosedTrace(t.trace_id, t.spans[:4]), [update_of(t.spans[0])], "paths", batch)
    placeholder = "MERGE (s:Span {id: $id}) ON CREATE SET s.seen = 1"
    counts = await _written_without_refusal(url, names[0], [batch], placeholder, id=t.spans[4].span_id)
    assert counts == [[2, 1, 1, 1]]  # db -> capture_payment (the placeholder: no name, no trace)
