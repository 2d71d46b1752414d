"""Keys for statements whose parameters are not on their spans: by the row change (writes), by the trace (reads),
else a predicate that may match; ambiguity kept explicit; bound parameters still win."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from processors.correlation.engine import Correlation, RowCorrelator
from processors.correlation.keying import KeyInference
from processors.detectors.collisions.views import moves_row, reads_row
from processors.model.events import (
    Access,
    CdcOp,
    Commit,
    DbCall,
    Resource,
    RowChange,
    Scalar,
    SpanKind,
    StatusCode,
)
from processors.model.span import Span
from processors.sql import SqlAccessExtractor

MS = 1_000_000
A, B = "a" * 32, "b" * 32
EXTRACTOR = SqlAccessExtractor(key_columns={"accounts": ["id"], "bookings": ["id"], "doctors": ["name"]})


def access(statement: str, *, trace: str = A, span: str = "s1", at_ms: int = 1000, params: tuple[Scalar, ...] = (),
           request_end_ms: int = 0) -> Access:  # fmt: skip
    """The access stage 1 derives from one DB span (its request ending at ``request_end_ms``)."""
    s = Span(trace_id=trace, span_id=span, parent_id="p", name="db", kind=SpanKind.CLIENT, start_ns=at_ms * MS,
             end_ns=(at_ms + 1) * MS, status=StatusCode.UNSET, resource=Resource(service="bank"),
             db=DbCall(system="postgresql", statement=statement, params=params))  # fmt: skip
    [a] = EXTRACTOR.accesses(s)
    return replace(a, request_start_ns=at_ms * MS, request_end_ns=(request_end_ms or at_ms + 10) * MS)


def change(row: Any, before: dict[str, Any] | None, after: dict[str, Any] | None, *, table: str = "public.accounts",
           key: str = "id", commit_ms: int = 1005, lsn: int = 1, tx: str = "") -> RowChange:  # fmt: skip
    op = CdcOp.CREATE if before is None else CdcOp.UPDATE
    return RowChange(table, op, ((key, row),), before, after, commit_ms, commit_ms + 5, lsn, tx)


READ = "SELECT balance FROM accounts WHERE id = %s"
WRITE = "UPDATE accounts SET balance = %s WHERE id = %s"


def credit(correlator: RowCorrelator, *changes: RowChange) -> list[tuple[RowChange, Correlation | None]]:
    return correlator.correlate_many(list(changes))


def test_a_write_without_its_key_takes_the_row_of_its_change_and_keys_the_read_that_guarded_it() -> None:
    """by_change for the UPDATE, by_trace for the SELECT before it on the same table and key column."""
    read, write = access(READ, span="r", at_ms=1000), access(WRITE, span="w", at_ms=1002)
    assert (read.entity, write.entity, write.keying) == ("accounts:*", "accounts:*", "predicate")
    correlator, keying = RowCorrelator(), KeyInference()
    for a in (read, write):
        correlator.add_access(a)
        keying.add(a)
    [(c, found)] = credit(correlator, change(7, {"id": 7, "balance": 100}, {"id": 7, "balance": 110}))
    assert found is not None and found.access == write
    w, r = keying.credited(c, found)
    assert (w.span_id, w.entity, w.keyed, w.keying) == ("w", "accounts:7", True, "by_change")
    assert (r.span_id, r.entity, r.keyed, r.keying, r.lock) == ("r", "accounts:7", True, "by_trace", read.lock)
    assert 0 < r.key_confidence < w.key_confidence <= 1
    assert keying.credited(c, found) == []  # a change delivered again keys nothing twice


def test_a_read_after_the_write_or_on_another_column_is_not_keyed_by_it() -> None:
    keying = KeyInference()
    later = access(READ, span="later", at_ms=1003)
    other = access("SELECT balance FROM accounts WHERE owner = %s", span="other", at_ms=1000)
    write = access(WRITE, span="w", at_ms=1002)
    for a in (later, other, write):
        keying.add(a)
    c = change(7, {"id": 7, "owner": "x", "balance": 1}, {"id": 7, "owner": "x", "balance": 2})
    keyed = keying.credited(c, Correlation(write, "values_time", 0.0, ""))
    assert [a.span_id for a in keyed] == ["w"]  # the others stay predicates (may match), never guessed


def test_a_predicate_read_gets_the_values_its_trace_then_inserted() -> None:
    """``SELECT ... WHERE room = %s AND day = %s`` then ``INSERT (room, day, ...)``: the read's values are the row's."""
    keying = KeyInference()
    find = access("SELECT id FROM bookings WHERE room = %s AND day = %s", span="f", at_ms=1000)
    insert = access("INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s)", span="i", at_ms=1002)
    assert (find.unbound, find.exact, insert.set_columns) == ((("room", "="), ("day", "=")), False,
                                                              ("room", "day", "guest"))  # fmt: skip
    keying.add(find)
    row = {"id": 1, "room": 5, "day": "mon", "guest": "ada"}
    out = keying.credited(change(1, None, row, table="public.bookings"), Correlation(insert, "values_time", 0.0, ""))
    bound = next(a for a in out if a.span_id == "f")
    assert (bound.keying, bound.exact, bound.predicates) == ("by_trace", True, (("room", "=", 5), ("day", "=", "mon")))
    assert reads_row(bound, "bookings:1", row) is True and reads_row(bound, "bookings:1", {**row, "room": 6}) is False


def test_ambiguity_is_explicit_k_rows_never_one_guessed() -> None:
    """Two value-less writers of two rows at the same time: each credited ``tied`` among 2 changes, neither keyed;
    a read is bound only by what both candidate rows agree on."""
    correlator, keying = RowCorrelator(), KeyInference()
    mine = access("SELECT id FROM bookings WHERE room = %s AND day = %s", span="f", at_ms=1000)
    guess = access("SELECT id FROM bookings WHERE guest = %s", span="g", at_ms=1000)
    w1 = access("INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s)", span="i", at_ms=1002)
    w2 = access("INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s)", trace=B, span="j", at_ms=1002)
    for a in (mine, guess, w1, w2):
        correlator.add_access(a)
        keying.add(a)
    rows = [change(n, None, {"id": n, "room": 5, "day": "mon", "guest": g}, table="public.bookings", lsn=n)
            for n, g in ((1, "ada"), (2, "bo"))]  # fmt: skip
    credited = credit(correlator, *rows)
    assert [(f.strength, len(f.among)) for _, f in credited if f is not None] == [("tied", 2), ("tied", 2)]
    c, found = next((c, f) for c, f in credited if f is not None and f.access.trace_id == A)
    out = keying.credited(c, found)
    assert [a.span_id for a in out] == ["f"]  # no by_change: which row the INSERT made is not known
    assert (out[0].key_candidates, out[0].predicates) == (2, (("room", "=", 5), ("day", "=", "mon")))
    assert keying.telemetry.events["ambiguous"] == 1  # and the guest, on which the rows differ, is never bound


def test_a_transactions_changes_are_matched_to_its_statements_in_order() -> None:
    correlator = RowCorrelator()
    debit = access("UPDATE accounts SET balance = balance - %s WHERE id = %s", span="d", at_ms=1000)
    credit_ = access("UPDATE accounts SET balance = balance + %s WHERE id = %s", span="c", at_ms=1002)
    for a in (debit, credit_):
        correlator.add_access(a)
    out = credit(correlator, change(1, {"id": 1, "balance": 5}, {"id": 1, "balance": 4}, lsn=1, tx="9"),
                 change(2, {"id": 2, "balance": 5}, {"id": 2, "balance": 6}, lsn=2, tx="9"))  # fmt: skip
    assert [(c.entity_key, f.strength, f.access.span_id) for c, f in out if f] == [
        ("accounts:1", "tx_order", "d"),
        ("accounts:2", "tx_order", "c"),
    ]


def test_undecidable_predicates_may_match_never_silently_no_match() -> None:
    """A predicate read whose WHERE values are missing: a row its known terms allow is *may* (None), one they exclude
    is not; a change that takes a row out of the known terms may have moved it."""
    count = access("SELECT count(*) FROM doctors WHERE shift = %s AND on_call", span="n")
    on, off = {"name": "x", "shift": 1, "on_call": True}, {"name": "x", "shift": 1, "on_call": False}
    assert (reads_row(count, "doctors:x", on), reads_row(count, "doctors:x", off)) == (None, False)
    went_off = Commit(change("x", on, off, table="public.doctors", key="name"))
    assert moves_row(count, went_off) is None
    bound = access("SELECT count(*) FROM doctors WHERE shift = %s AND on_call", span="n", params=(2,))
    assert (reads_row(bound, "doctors:x", on), moves_row(bound, went_off)) == (False, False)  # bound values decide


def test_bound_parameters_still_win() -> None:
    """With its parameters on the span a statement is keyed as before (``bound``) and nothing is inferred for it."""
    correlator, keying = RowCorrelator(), KeyInference()
    read, write = access(READ, span="r", params=(7,)), access(WRITE, span="w", at_ms=1002, params=(110, 7))
    assert (read.entity, read.keying, write.entity, write.keying) == ("accounts:7", "bound", "accounts:7", "bound")
    for a in (read, write):
        correlator.add_access(a)
        keying.add(a)
    [(c, found)] = credit(correlator, change(7, {"id": 7, "balance": 100}, {"id": 7, "balance": 110}))
    assert found is not None and found.access == write and keying.credited(c, found) == []


def test_state_is_bounded_counted_and_pruned_by_event_time() -> None:
    keying = KeyInference(max_traces=2, per_trace=1)
    for trace, at in ((A, 1000), (B, 2000), ("c" * 32, 3000)):
        keying.add(access(READ, trace=trace, span="r", at_ms=at))
    keying.add(access(READ, trace="c" * 32, span="r2", at_ms=3001))
    assert len(keying) == 2 and keying.telemetry.dropped == {"max_traces": 1, "per_trace": 1}
    assert keying.prune(2500 * MS) == 1 and len(keying) == 1


def test_reads_before_two_writes_of_one_shape_are_not_guessed() -> None:
    """Read source, read target, write source, write target (keys not on the spans): which read guarded which write
    is not known, so neither read is keyed by its trace (the writes still are, by their changes)."""
    keying = KeyInference()
    mine = [access(READ, span="r1", at_ms=1000), access(READ, span="r2", at_ms=1001),
            access(WRITE, span="w1", at_ms=1002), access(WRITE, span="w2", at_ms=1003)]  # fmt: skip
    for a in mine:
        keying.add(a)
    c = change(7, {"id": 7, "balance": 1}, {"id": 7, "balance": 2})
    assert [a.span_id for a in keying.credited(c, Correlation(mine[2], "tx_id", 0.0, ""))] == ["w1"]
    assert keying.telemetry.events["ambiguous_reads"] == 2  # both reads
