"""Anomalies through predicates only PostgreSQL-like evaluation decides (``value % 3 = 0``), from the spans' SQL.

The accesses are extracted from DB client spans as stage 1 does, sent through the internal topic's codec as the
stage hand-off does, and judged by the collision detector against committed row changes credited to their writers.
"""

from __future__ import annotations

from typing import Any

from processors.detectors.collisions import CollisionDetector
from processors.detectors.collisions.views import Collision
from processors.model.events import Access, CdcOp, Commit, RowChange
from processors.model.span import DbCall, Resource, Span, SpanKind, StatusCode
from processors.sql import SqlAccessExtractor
from processors.sql.values import predicate_text
from streamer.decode.internal import decode, encode_access

MS = 1_000_000
T0 = 1_800_000_000_000 * MS


def _span(trace: str, n: int, at_ms: int, statement: str, params: tuple[Any, ...] = ()) -> Span:
    start = T0 + at_ms * MS
    return Span(trace_id=trace * 32, span_id=f"{n:016x}", parent_id="", name="db", kind=SpanKind.CLIENT,
                start_ns=start, end_ns=start + MS, status=StatusCode.UNSET, resource=Resource("shop", "1"),
                db=DbCall(system="postgresql", statement=statement, params=params))  # fmt: skip


def _stage_two(extractor: SqlAccessExtractor, span: Span) -> Access:
    [access] = extractor.accesses(span)
    decoded = decode(encode_access(access))
    assert isinstance(decoded, Access)
    return decoded


def _double_insert(read: str, values: tuple[int, int]) -> tuple[list[Collision], list[Access], dict[str, int]]:
    """Two requests each read ``read`` (no parameters), then each insert a row whose key the database assigns."""
    ex = SqlAccessExtractor({"items": ["id"]})
    d = CollisionDetector(window_ns=500 * MS, settle_ns=0)
    reads = [_stage_two(ex, _span(t, i, i, read)) for i, t in enumerate("ab")]
    inserts = [_stage_two(ex, _span(t, 10 + i, 3 + i, "INSERT INTO items (value, note) VALUES (%s, %s)", (v, t)))
               for i, (t, v) in enumerate(zip("ab", values, strict=True))]  # fmt: skip
    for a in (*reads, *inserts):
        d.on_access(a)
    for lsn, (insert, value) in enumerate(zip(inserts, values, strict=True), start=1):
        row = {"id": 16 + lsn, "value": value, "note": insert.trace_id[0]}
        change = RowChange(table="public.items", op=CdcOp.CREATE, key=(("id", row["id"]),), before=None, after=row,
                           commit_ts_ms=T0 // MS + 20 + lsn, ts_ms=0, lsn=lsn, tx_id=str(lsn))  # fmt: skip
        d.on_commit(f"items:{row['id']}", Commit(change, insert.trace_id, insert.span_id, "values_time"))
    return d.close_until(T0 + 10_000 * MS), reads, d.counters


def test_a_double_insert_through_a_modulo_predicate_is_a_phantom() -> None:
    """Both read ``WHERE value % 3 = 0`` and both insert a row it selects (6, 9): the phantom the issue missed."""
    found, reads, _ = _double_insert("SELECT id, value FROM items WHERE value % 3 = 0", (6, 9))
    assert all(not r.keyed and r.exact and r.where is not None for r in reads)
    assert predicate_text(reads[0].predicates, reads[0].exact, reads[0].where) == "value % 3 = 0"
    [c] = found
    assert (c.anomaly, c.adya) == ("phantom", "G2")
    assert c.entities == ("items:17", "items:18")


def test_rows_the_modulo_predicate_does_not_select_are_no_phantom() -> None:
    """The control: the inserted rows (7, 10) are outside ``value % 3 = 0``, so neither insert changed a read."""
    found, _, counters = _double_insert("SELECT id, value FROM items WHERE value % 3 = 0", (7, 10))
    assert found == []
    assert not any(k.startswith("predicate_undecidable") for k in counters)  # decided: FALSE


def test_an_undecidable_predicate_is_no_phantom_and_is_counted() -> None:
    """A function the evaluator does not know leaves the predicate undecidable: no anomaly is claimed from it, the
    detector counts each evaluation it could not decide and stage 1 each such predicate access, by reason."""
    found, _, counters = _double_insert("SELECT id FROM items WHERE my_bucket(value) = 0", (6, 9))
    assert found == []
    assert counters["predicate_undecidable_unknown_function"] > 0
    ex = SqlAccessExtractor({"items": ["id"]})
    ex.accesses(_span("c", 1, 0, "SELECT id FROM items WHERE my_bucket(value) = 0 OR value IN (%s)"))
    assert ex.counters["predicate_undecidable_unknown_function"] == 1
    assert ex.counters["predicate_undecidable_unbound_parameter"] == 1
