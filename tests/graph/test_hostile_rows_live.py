"""Rows whose content FalkorDB cannot hold as it is, written through the graph sink to the real FalkorDB: values are
replaced (and counted), never the row dropped, and a row refused for its content is dead-lettered with it."""

from __future__ import annotations

import json

import pytest

from processors.graph.rows import trace_rows
from processors.model.events import DbCall
from processors.model.graph import GraphBatch
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from sinks.graph.params import REPLACEMENT, render
from sinks.graph.rows import DeadRow
from sinks.graph.sink import GraphSink
from tests.graph.checkout_request import span, update_of

pytestmark = pytest.mark.engines

NUL = "\x00"
SURROGATE = "\ud800"


def _with(s: Span, **changes: object) -> Span:
    fields = ("trace_id", "span_id", "parent_id", "name", "kind", "start_ns", "end_ns", "status", "resource",
              "route", "code_function", "code_file", "db")  # fmt: skip
    values = {f: getattr(s, f) for f in fields} | changes
    return Span(**values)  # type: ignore[arg-type]


def hostile_request(tid: str) -> tuple[ClosedTrace, GraphBatch]:
    """A request whose DB span's statement holds a NUL, whose handler's name holds a lone surrogate and whose root's
    route holds both, under the ``paths`` policy (one trace row carries the trace and its three kept spans)."""
    db = _with(
        span(tid, 3, 2, "db", db=True), db=DbCall("postgresql", f"UPDATE orders SET note = 'a{NUL}b' WHERE id = %s")
    )
    spans = (
        db,
        _with(span(tid, 2, 1, "capture_payment"), name=f"capture{SURROGATE}payment", code_file=f"pay{NUL}.py"),
        _with(span(tid, 1, 0, "POST /orders/{id}/capture"), route=f"/orders/{NUL}{SURROGATE}"),
    )
    trace = ClosedTrace(tid, spans)
    batch = GraphBatch()
    trace_rows(trace, [update_of(db)], "paths", batch)
    return trace, batch


def test_the_header_replaces_what_falkordb_cannot_hold_and_counts_it() -> None:
    text, replaced = render({"rows": [[f"a{NUL}b", f"c{SURROGATE}", float("nan"), "ok", "\x01\x1f"]]})
    assert text == f'CYPHER `rows`=[["a{REPLACEMENT}b","c{REPLACEMENT}",null,"ok","\x01\x1f"]] '
    assert replaced == 3
    text.encode("utf-8")  # what the client sends


async def test_a_nul_or_a_lone_surrogate_in_any_attribute_keeps_the_trace(sink: GraphSink) -> None:
    """The trace, its three kept spans and the WROTE edge are in the graph, each value with U+FFFD where FalkorDB
    cannot hold a character, every other character as it was; nothing is refused, and the replacements counted."""
    tid = "f" * 32
    _, batch = hostile_request(tid)
    await sink.write_batch(batch)
    rows = await sink.query("MATCH (s:Span)-[:OF]->(t:Trace {id: $t}) RETURN s.name, s.statement, s.file, t.root "
                            "ORDER BY s.start", {"t": tid})  # fmt: skip
    r = REPLACEMENT
    assert rows == [  # an empty detail (no statement, no file) is not stored: ``rows.BARE``
        ["POST /orders/{id}/capture", None, None, f"/orders/{r}{r}"],
        [f"capture{r}payment", None, f"pay{r}.py", f"/orders/{r}{r}"],
        ["db", f"UPDATE orders SET note = 'a{r}b' WHERE id = %s", "shop/pay.py", f"/orders/{r}{r}"],
    ]
    assert await sink.query("MATCH (:Span)-[w:WROTE]->(:Entity {key: 'orders:8812'}) RETURN count(w)") == [[1]]
    assert sink.telemetry.events["replaced_values"] >= 6


async def test_a_row_refused_for_its_content_is_dead_lettered_with_its_content(sink: GraphSink) -> None:
    """A window row with a map value (FalkorDB refuses map properties) among good ones: the others are written; the
    refused row is handed over whole, as JSON, with FalkorDB's reason."""
    batch = GraphBatch(windows=[{"id": "w1", "start": 1.0, "end": 2.0}, {"id": "w2", "start": {"k": 1}, "end": 3.0},
                                {"id": "w3", "start": 3.0, "end": 4.0}])  # fmt: skip
    dead: list[DeadRow] = []
    await sink.write_batch(batch, dead)
    assert await sink.query("MATCH (w:Window) RETURN w.id ORDER BY w.id") == [["w1"], ["w3"]]
    [refused] = dead
    assert json.loads(refused.value) == {"op": "windows", "row": {"id": "w2", "start": {"k": 1}, "end": 3.0}}
    assert dict(refused.headers)["reason"] == b"graph_row_refused"
    assert b"Property values can only be" in dict(refused.headers)["error"]
