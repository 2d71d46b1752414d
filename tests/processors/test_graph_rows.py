"""graph_rows: the detail policy and clean(), which keeps FalkorDB parameter values plain data."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.graph.rows import (
    OMITTED_COLUMNS,
    PATH_SPAN_COLUMNS,
    access_rows,
    change_row,
    clean,
    detailed,
    omitted_spans,
    omitted_text,
    paths,
    trace_rows,
)
from processors.model.events import (
    Access,
    CdcOp,
    DbCall,
    DbOperation,
    LockMode,
    Resource,
    RowChange,
    SpanKind,
    StatusCode,
)
from processors.model.graph import GraphBatch
from processors.model.span import Span
from processors.model.trace import ClosedTrace

MS = 1_000_000
T = "ab" * 16
TP = ("otlp_spans", 0)


def span(sid: int, *, parent: int = 0, error: bool = False, db: DbCall | None = None) -> Span:
    return Span(
        trace_id=T,
        span_id=f"{sid:016x}",
        parent_id=f"{parent:016x}" if parent else "",
        name="POST /orders" if not parent else f"child{sid}",
        kind=SpanKind.SERVER if not parent else (SpanKind.CLIENT if db else SpanKind.INTERNAL),
        start_ns=1_000 * MS + sid * MS,
        end_ns=1_100 * MS,
        status=StatusCode.ERROR if error else StatusCode.UNSET,
        resource=Resource("checkout", "1.2.3"),
        route="/orders" if not parent else "",
        db=db,
    )


def trace(*, error: bool = False) -> ClosedTrace:
    db = DbCall("postgresql", "UPDATE orders SET status = %s WHERE id = %s")
    spans = (span(1, error=error), span(2, parent=1), span(3, parent=2, db=db))
    return ClosedTrace(T, spans, frozenset({(TP, 0)}))


def access(entity: str = "orders:8812", op: DbOperation = DbOperation.WRITE) -> Access:
    return Access(
        entity=entity,
        table=entity.split(":")[0],
        operation=op,
        lock=LockMode.NONE,
        trace_id=T,
        span_id=f"{3:016x}",
        service="checkout",
        version="1.2.3",
        start_ns=1_003 * MS,
        end_ns=1_100 * MS,
        statement="UPDATE orders SET status = %s WHERE id = %s",
        params=("paid", 8812),
    )


def rows(t: ClosedTrace, accesses: list[Access], policy: str) -> GraphBatch:
    batch = GraphBatch()
    trace_rows(t, accesses, policy, batch)
    return batch


@pytest.mark.parametrize(
    ("policy", "error", "with_access", "want"),
    [
        ("all", False, False, True),
        ("all", True, True, True),
        ("none", True, True, False),
        ("none", False, False, False),
        ("entities_or_errors", False, False, False),
        ("entities_or_errors", True, False, True),
        ("entities_or_errors", False, True, True),
    ],
)
def test_detail_policy(policy: str, error: bool, with_access: bool, want: bool) -> None:
    """all details every trace, none no trace, entities_or_errors those that touch a row or fail."""
    t = trace(error=error)
    accesses = [access()] if with_access else []
    assert detailed(t, accesses, policy) is want
    batch = rows(t, accesses, policy)
    seen = trace().end_ns / 1e6  # aggregates are fed either way, stamped with the event time they were last seen
    assert batch.services == [{"name": "checkout", "seen": seen}]
    assert batch.operations == [{"key": "checkout:/orders", "service": "checkout", "name": "/orders", "seen": seen}]
    assert len(batch.traces) == (1 if want else 0)
    assert len(batch.spans) == (3 if want else 0)
    assert len(batch.child_of) == (2 if want else 0)
    assert len(batch.writes) == (1 if want and with_access else 0)


def test_detailed_trace_rows() -> None:
    """A detailed trace becomes one Trace row, a Span row per span, CHILD_OF per known parent, and its accesses."""
    batch = rows(trace(error=True), [access(), access("orders:9", DbOperation.READ)], "entities_or_errors")
    assert batch.traces == [
        {
            "id": T,
            "root": "/orders",
            "service": "checkout",
            "start": 1_001.0,
            "duration_ms": 99.0,
            "status": "error",
            "version": "1.2.3",
            "rooted": True,
            "end": 1_100.0,
        }
    ]
    assert {r["id"] for r in batch.spans} == {f"{i:016x}" for i in (1, 2, 3)}
    assert sorted((r["id"], r["parent"]) for r in batch.child_of) == [
        (f"{2:016x}", f"{1:016x}"),
        (f"{3:016x}", f"{2:016x}"),
    ]
    [db_span] = [r for r in batch.spans if r["id"] == f"{3:016x}"]
    assert db_span["kind"] == "client"
    assert db_span["statement"].startswith("UPDATE orders")
    assert [(r["entity"], r["table"]) for r in batch.writes + batch.reads] == [
        ("orders:8812", "orders"),
        ("orders:9", "orders"),
    ]
    assert [r["entity"] for r in batch.writes] == ["orders:8812"]
    assert [r["entity"] for r in batch.reads] == ["orders:9"]
    assert batch.writes[0]["params"] == ["paid", 8812]


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),
        (True, True),
        (False, False),
        ("x", "x"),
        (0, 0),
        (2**63 - 1, 2**63 - 1),
        (-(2**63 - 1), -(2**63 - 1)),
        (2**63, str(2**63)),
        (-(2**70), str(-(2**70))),
        (10**40, "1" + "0" * 40),
        (1.5, 1.5),
        (float("nan"), None),
        (float("inf"), None),
        (float("-inf"), None),
        (b"\x00\xffA", "00ff41"),
        (bytearray(b"\x01"), "01"),
        (Decimal("1.10"), "1.10"),
    ],
)
def test_clean_scalars(value: Any, want: Any) -> None:
    """NaN/inf become null, bytes hex, integers beyond 64 bits text; plain scalars pass unchanged."""
    got = clean(value)
    assert got == want
    assert type(got) is type(want)


def test_clean_lists_recursively() -> None:
    """Lists and tuples become lists whose items are cleaned."""
    assert clean((1, float("nan"), b"\x01", [2**64, "s"], (True,))) == [1, None, "01", [str(2**64), "s"], [True]]


def test_clean_nested_dicts_become_json_text() -> None:
    """A (nested) dict becomes one JSON string with sorted keys; odd values inside are stringified, not lost."""
    got = clean({"b": {"y": [1, 2], "x": None}, "a": b"\x01", "c": 2**70})
    assert isinstance(got, str)
    assert json.loads(got) == {"a": "b'\\x01'", "b": {"x": None, "y": [1, 2]}, "c": 2**70}
    assert got.index('"a"') < got.index('"b"') < got.index('"c"')
    assert clean([{"k": 1}]) == ['{"k": 1}']


@given(st.text())
def test_clean_returns_any_string_unchanged(s: str) -> None:
    """Strings (quotes, backslashes, newlines, unicode) pass unchanged: they are Cypher parameters, never query text."""
    assert clean(s) is s
    assert clean([s, (s,)]) == [s, [s]]
    batch = GraphBatch()
    access_rows([access(entity=s)], batch)
    assert batch.writes[0]["table"] == s.split(":")[0]
    assert batch.writes[0]["entity"] == s


@pytest.mark.parametrize(
    "s", ["it's", 'say "hi"', "back\\slash", "line\nbreak\r\n", "}) DETACH DELETE n //", "ключ 🔑"]
)
def test_clean_keeps_hostile_strings_in_row_changes(s: str) -> None:
    """A change row carries hostile strings intact: as the entity and inside its JSON row images."""
    change = RowChange(
        table="public.orders",
        op=CdcOp.UPDATE,
        key=(("id", s),),
        before=None,
        after={"id": s, "note": s},
        commit_ts_ms=1_000,
        ts_ms=1_001,
        lsn=7,
        tx_id="42",
    )
    row = change_row(change, f"orders:{s}", None)
    assert row["entity"] == f"orders:{s}"
    assert json.loads(row["after"]) == {"id": s, "note": s}
    assert row["before"] is None
    assert (row["span"], row["strength"], row["skew_ms"]) == (None, "none", None)


# ---- the paths policy (the default): what readers read, one row per trace -------------------------------------


def wide_trace() -> ClosedTrace:
    """root(1) -> handler(2) -> {db access(3), db without access(4), cache(5)}; root(1) -> audit(6) -> error(7);
    root(1) -> render(8) -> template(9)."""
    db = DbCall("postgresql", "UPDATE orders SET status = %s WHERE id = %s")
    select = DbCall("postgresql", "SELECT 1")
    spans = (
        span(9, parent=8), span(3, parent=2, db=db), span(1), span(2, parent=1), span(4, parent=2, db=select),
        span(5, parent=2), span(6, parent=1), span(7, parent=6, error=True), span(8, parent=1),
    )  # fmt: skip
    return ClosedTrace(T, spans)


def test_paths_keeps_access_and_error_spans_with_their_ancestors() -> None:
    """Kept: the access span, the error span, and every ancestor to the root; a DB span without an access, a
    sibling and an unrelated subtree are omitted."""
    kept, omitted = paths(wide_trace(), [access()])
    assert sorted(int(s.span_id, 16) for s in kept) == [1, 2, 3, 6, 7]
    assert sorted(int(s.span_id, 16) for s in omitted) == [4, 5, 8, 9]


def test_paths_trace_row_carries_its_kept_spans_and_the_omitted_summary() -> None:
    """One Trace row per detailed trace: its kept spans as positional lists (parent only when kept), the rest as a
    compact JSON property; no per-span or CHILD_OF rows; the access rows as under every policy."""
    batch = rows(wide_trace(), [access()], "paths")
    assert (batch.spans, batch.child_of) == ([], [])
    [row] = batch.traces
    spans = {s[0]: dict(zip(PATH_SPAN_COLUMNS, s, strict=True)) for s in row["spans"]}
    assert set(spans) == {f"{i:016x}" for i in (1, 2, 3, 6, 7)}
    assert spans[f"{1:016x}"]["parent"] is None
    assert spans[f"{3:016x}"]["parent"] == f"{2:016x}"
    assert spans[f"{3:016x}"]["statement"].startswith("UPDATE orders")
    assert spans[f"{7:016x}"]["status"] == "error"
    assert [r["span"] for r in batch.writes] == [f"{3:016x}"]
    omitted = omitted_spans(row["omitted"])
    assert [o["name"] for o in omitted] == ["child4", "child5", "child8", "child9"]  # in start order
    assert omitted[0] == {"name": "child4", "service": "checkout", "offset_ms": 3.0, "duration_ms": 96.0,
                          "status": "unset"}  # fmt: skip


def test_paths_without_omitted_spans_has_no_summary() -> None:
    batch = rows(trace(), [access()], "paths")
    assert batch.traces[0]["omitted"] is None
    assert len(batch.traces[0]["spans"]) == 3


def test_paths_policy_details_the_same_traces_as_entities_or_errors() -> None:
    """Which traces are detailed does not change (the bench's trace count holds): only which of their spans."""
    for error, accesses in ((False, []), (True, []), (False, [access()])):
        assert detailed(trace(error=error), accesses, "paths") is detailed(trace(error=error), accesses,
                                                                          "entities_or_errors")  # fmt: skip
        assert len(rows(trace(error=error), accesses, "paths").traces) == (1 if error or accesses else 0)


@given(st.lists(st.tuples(st.text(), st.text(), st.sampled_from(list(StatusCode))), max_size=8))
def test_omitted_summary_round_trips(items: list[tuple[str, str, StatusCode]]) -> None:
    """Any names and services (quotes, backslashes, unicode) survive the JSON property, with offsets and status."""
    spans = [
        Span(trace_id=T, span_id=f"{i + 1:016x}", parent_id="", name=name, kind=SpanKind.INTERNAL,
             start_ns=1_000 * MS + i * MS, end_ns=1_000 * MS + i * MS + 1_500_000, status=status,
             resource=Resource(service, "1"))
        for i, (name, service, status) in enumerate(items)
    ]  # fmt: skip
    text = omitted_text(spans, 1_000 * MS)
    if not items:
        assert text is None and omitted_spans(text) == []
        return
    assert isinstance(text, str)
    got = omitted_spans(text)
    assert [tuple(o[c] for c in OMITTED_COLUMNS) for o in got] == [
        (name, service, float(i), 1.5, status.name.lower()) for i, (name, service, status) in enumerate(items)
    ]


def _paths_by_every_span(t: ClosedTrace, accesses: list[Access]) -> tuple[list[str], list[str]]:
    """``paths`` spelt out as it first was: every span tested, its ancestors walked (the reference)."""
    by_id, wanted, keep = t.facts.by_id, {a.span_id for a in accesses}, set()
    for s in t.spans:
        node: Span | None = s if s.span_id in wanted or s.status == StatusCode.ERROR or s.exception_type else None
        while node is not None and node.span_id not in keep:
            keep.add(node.span_id)
            node = by_id.get(node.parent_id)
    return [s.span_id for s in t.spans if s.span_id in keep], [s.span_id for s in t.spans if s.span_id not in keep]


@given(
    st.lists(st.integers(0, 11), min_size=1, max_size=12),
    st.lists(st.integers(1, 14), max_size=4),
    st.sets(st.integers(1, 12), max_size=2),
    st.booleans(),
)
def test_paths_keeps_what_testing_every_span_keeps(
    parents: list[int], accessed: list[int], failed: set[int], repeat_an_id: bool
) -> None:
    """Walking from the access spans alone (no span failed, ids unique) keeps what testing every span keeps, in the
    trace's order; as do traces with failed spans, repeated span ids and accesses naming no span of the trace."""
    spans = [span(i + 1, parent=p if p <= i else 0, error=i + 1 in failed) for i, p in enumerate(parents)]
    if repeat_an_id:
        spans.append(span(1, parent=len(spans)))
    t = ClosedTrace(T, tuple(spans))
    accesses = [dataclasses.replace(access(), span_id=f"{i:016x}") for i in accessed]
    kept, omitted = paths(t, accesses)
    assert ([s.span_id for s in kept], [s.span_id for s in omitted]) == _paths_by_every_span(t, accesses)


@given(
    st.lists(st.tuples(st.integers(-(10**16), 10**16), st.integers(-(10**7), 10**16)), max_size=6),
    st.integers(0, 10**16),
    st.text(st.characters(codec=None, categories=None), max_size=6)
    | st.sampled_from(["\ud800", "a\udfffb", "\x00\x1f\x7f\u2028"]),
)
def test_omitted_offsets_and_durations_are_rounded_as_round_does(
    times: list[tuple[int, int]], start: int, name: str
) -> None:
    """Offsets and durations are ``round(ns / 1e6, 3)``'s floats to the bit (``-0.0``, halves, huge values too), and
    the text is json's, whatever the names (control characters, lone surrogates)."""
    times += [(start + 4_500, 1_000_500), (start, -100), (start + 1_500, 10**16 + 500)]  # halves, -0.0, huge
    spans = [
        Span(
            trace_id=T,
            span_id=f"{i + 1:016x}",
            parent_id="",
            name=name,
            kind=SpanKind.INTERNAL,
            start_ns=begin,
            end_ns=begin + duration,
            status=StatusCode.OK,
            resource=Resource("s", "1"),
        )
        for i, (begin, duration) in enumerate(times)
    ]
    want = [
        [name, "s", round((s.start_ns - start) / 1e6, 3), round((s.end_ns - s.start_ns) / 1e6, 3), "ok"]
        for s in sorted(spans, key=lambda s: s.start_ns)
    ]
    assert omitted_text(spans, start) == json.dumps(want, separators=(",", ":"), ensure_ascii=False)


def test_services_and_operations_are_one_row_each_per_batch() -> None:
    """Every trace feeds services and operations, but a batch holds each name once (the graph MERGEs them anyway)."""
    batch = GraphBatch()
    for policy in ("paths", "none", "all"):
        trace_rows(trace(), [access()], policy, batch)
    seen = trace().end_ns / 1e6
    assert batch.services == [{"name": "checkout", "seen": seen}]
    assert batch.operations == [{"key": "checkout:/orders", "service": "checkout", "name": "/orders", "seen": seen}]
