"""RowCorrelator: Debezium row changes → the span Access that made them."""

from __future__ import annotations

import itertools
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from processors.correlation.engine import RowCorrelator, same_value
from processors.model.events import (
    Access,
    CdcOp,
    DbCall,
    DbOperation,
    LockMode,
    Resource,
    RowChange,
    Scalar,
    SpanKind,
    StatusCode,
)
from processors.model.span import Span
from processors.sql import SqlAccessExtractor

T1 = "1" * 32
T2 = "2" * 32
MS = 1_000_000
_span_ids = itertools.count(1)


def write(
    trace: str,
    *,
    entity: str = "orders:8812",
    op: DbOperation = DbOperation.WRITE,
    sets: tuple[tuple[str, Scalar], ...] = (("status", "paid"),),
    exprs: tuple[str, ...] = (),
    tx: str = "",
    start_ms: int = 1000,
    end_ms: int = 1010,
    lock: LockMode = LockMode.NONE,
    error: bool = False,
    span_id: str = "",
) -> Access:
    return Access(
        entity=entity,
        table=entity.split(":")[0],
        operation=op,
        lock=lock,
        trace_id=trace,
        span_id=span_id or f"{next(_span_ids):016x}",
        service="checkout",
        version="1",
        start_ns=start_ms * MS,
        end_ns=end_ms * MS,
        statement="UPDATE orders SET status = ? WHERE id = ?",
        set_values=sets,
        set_exprs=exprs,
        tx_id=tx,
        error=error,
    )


def change(
    *,
    op: CdcOp = CdcOp.UPDATE,
    table: str = "public.orders",
    key: tuple[tuple[str, Any], ...] = (("id", 8812),),
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    commit_ms: int = 1008,
    tx: str = "",
) -> RowChange:
    if after is None and op is not CdcOp.DELETE:
        after = {"id": 8812, "status": "paid"}
    return RowChange(
        table=table,
        op=op,
        key=key,
        before=before,
        after=after,
        commit_ts_ms=commit_ms,
        ts_ms=commit_ms + 30,
        lsn=1,
        tx_id=tx,
    )


def test_trace_column_is_strongest() -> None:
    rc = RowCorrelator()
    a1, a2 = write(T1, tx="9"), write(T2, tx="9")
    rc.add_access(a1)
    rc.add_access(a2)
    got = rc.correlate(change(after={"id": 8812, "status": "paid", "trace_id": T2.upper()}, tx="9"))
    assert got is not None
    assert (got.access, got.strength, got.skew_ms) == (a2, "trace_column", 0.0)
    assert rc.counters["matched_trace_column"] == 1


def test_trace_column_for_delete_reads_before_image() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, op=DbOperation.DELETE, sets=()))
    d = rc.correlate(change(op=CdcOp.DELETE, before={"id": 8812, "trace_id": T1}, commit_ms=99_999))
    assert d is not None and d.strength == "trace_column"


def test_unchanged_trace_column_is_not_evidence() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, tx="5"))
    rc.add_access(write(T2, tx="6"))
    stale = {"id": 8812, "status": "paid", "trace_id": T1}
    got = rc.correlate(change(after=stale, before={**stale, "status": "new"}, tx="6"))
    assert got is not None and (got.access.trace_id, got.strength) == (T2, "tx_id")
    assert rc.counters["trace_column_unchanged"] == 1


def test_tx_id_match() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, tx="771"))
    rc.add_access(write(T2, tx="772"))
    got = rc.correlate(change(tx="772", commit_ms=50_000))  # far outside any time window
    assert got is not None and (got.access.trace_id, got.strength, got.skew_ms) == (T2, "tx_id", 0.0)


def test_tx_id_tie_narrowed_by_values_else_ambiguous() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, tx="7", sets=(("status", "paid"),)))
    rc.add_access(write(T1, tx="7", sets=(("status", "shipped"),)))
    got = rc.correlate(change(tx="7", after={"id": 8812, "status": "shipped"}))
    assert got is not None and got.access.set_values == (("status", "shipped"),)
    assert rc.counters["narrowed_by_values"] == 1
    rc.add_access(write(T2, tx="7", sets=(("status", "shipped"),)))
    assert rc.correlate(change(tx="7", after={"id": 8812, "status": "shipped"})) is None
    assert rc.last_reason == "ambiguous_tx_id"


def test_values_and_time_match_with_debezium_schema_and_types() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, sets=(("status", "paid"), ("amount", "12.50"), ("flag", True))))
    rc.add_access(write(T2, sets=(("status", "cancelled"), ("amount", "12.50"), ("flag", True))))
    after = {"id": 8812, "status": "paid", "amount": Decimal("12.5"), "flag": True}
    got = rc.correlate(change(after=after, commit_ms=1012))
    assert got is not None
    assert (got.access.trace_id, got.strength, got.skew_ms) == (T1, "values_time", 0.0)


def test_expression_set_values_are_not_compared() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, sets=(("stock", "stock - 1"),), exprs=("stock",), entity="inventory:SKU-9"))
    got = rc.correlate(change(table="public.inventory", key=(("sku", "SKU-9"),), after={"stock": 4}))
    assert got is not None and got.strength == "values_time"
    assert "time only" in got.detail


@pytest.mark.parametrize(
    ("commit_ms", "skew"),
    [
        (1005, 4.000001),  # ms-truncated commit can be up to 0.999999 ms later than it says
        (1004, None),  # 5.000001 ms before the statement ended
        (1104, 4.0),  # after the request ended, within tolerance
        (1106, None),
        (1050, 0.0),
    ],
)
def test_skew_tolerance_against_request_interval(commit_ms: int, skew: float | None) -> None:
    """The commit must fall after the statement and before the request ended (the access carries its request)."""
    rc = RowCorrelator(skew_ms=5.0)
    rc.add_access(replace(write(T1), request_start_ns=990 * MS, request_end_ns=1100 * MS))
    got = rc.correlate(change(commit_ms=commit_ms))
    if skew is None:
        assert got is None and rc.last_reason == "unmatched"
    else:
        assert got is not None and got.skew_ms == pytest.approx(skew)


def test_without_interval_uses_max_commit_delay() -> None:
    """An access whose request end is unknown accepts a commit up to max_commit_delay_ms after the statement."""
    rc = RowCorrelator(max_commit_delay_ms=100.0)
    rc.add_access(write(T1))
    assert rc.correlate(change(commit_ms=1110)) is not None  # no request end: the fallback window
    assert rc.correlate(change(commit_ms=1116)) is None


def test_values_time_ambiguity_returns_none() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1))
    rc.add_access(write(T2, start_ms=1002, end_ms=1011))
    assert rc.correlate(change(commit_ms=1012)) is None
    assert rc.counters["ambiguous_values_time"] == 1


def test_operation_must_fit_change() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1))
    assert rc.correlate(change(op=CdcOp.DELETE, before={"id": 8812})) is None
    assert rc.last_reason == "no_candidates"
    rc.add_access(write(T2, op=DbOperation.INSERT, lock=LockMode.UPSERT))
    got = rc.correlate(change(tx="", commit_ms=1009))  # ON CONFLICT DO UPDATE shows up as an update
    assert got is None and rc.last_reason == "ambiguous_values_time"
    assert rc.correlate(change(op=CdcOp.READ)) is None
    assert rc.last_reason == "unsupported_op"


def test_reads_and_failed_statements_are_not_remembered() -> None:
    rc = RowCorrelator()
    rc.add_access(write(T1, op=DbOperation.READ))
    rc.add_access(write(T1, error=True))
    assert len(rc) == 0
    assert (rc.counters["ignored_reads"], rc.counters["ignored_errors"]) == (1, 1)


def test_redelivered_access_is_not_a_second_candidate() -> None:
    rc = RowCorrelator()
    a = write(T1)
    rc.add_access(a)
    rc.add_access(a)
    got = rc.correlate(change())
    assert got is not None and got.access == a
    assert rc.counters["duplicate_accesses"] == 1


def test_bounded_histories_evict_and_count() -> None:
    rc = RowCorrelator(history_per_entity=2, max_entities=2)
    for tx in ("1", "2", "3"):
        rc.add_access(write(T1, tx=tx))
    assert rc.telemetry.dropped["history_per_entity"] == 1
    assert rc.correlate(change(tx="1", commit_ms=50_000)) is None  # the oldest was dropped
    rc.add_access(write(T1, entity="orders:2"))
    rc.add_access(write(T1, entity="orders:3"))
    assert (len(rc), rc.telemetry.dropped["max_entities"]) == (2, 1)
    assert rc.correlate(change(tx="3")) is None and rc.last_reason == "no_candidates"


def test_the_byte_bound_forgets_the_least_recently_written_rows_and_counts_every_write() -> None:
    """Writes with megabyte statements on many rows: the histories' accounted size stays under the bound, the
    least recently written rows are forgotten first (each write counted), the row just written keeps its newest
    write even when it alone is over the bound, and what is still remembered credits its change."""
    mib = 1 << 20
    rc = RowCorrelator(max_bytes=4 * mib)
    for i in range(20):
        rc.add_access(replace(write(T1, entity=f"orders:{i}", tx=str(i)), statement="x" * mib))
        assert rc.bytes <= 4 * mib
    assert rc.telemetry.dropped["max_history_bytes"] == 20 - len(rc) > 0
    assert rc.telemetry.dropped["max_entities"] == 0
    assert rc.correlate(change(key=(("id", 19),), tx="19")) is not None  # the newest row is remembered
    assert rc.correlate(change(key=(("id", 0),), tx="0")) is None and rc.last_reason == "no_candidates"
    huge = RowCorrelator(max_bytes=2 * mib)
    for tx in ("1", "2", "3"):
        huge.add_access(replace(write(T1, tx=tx), statement="x" * (3 * mib)))
    assert (len(huge), huge.telemetry.dropped["max_history_bytes"]) == (1, 2)
    assert huge.correlate(change(tx="3")) is not None and huge.bytes > 2 * mib  # only its newest write is left
    rc.prune(10**20)
    assert (len(rc), rc.bytes) == (0, 0)  # what prune forgets leaves the account too


def test_a_byte_bound_leaves_ordinary_histories_as_they_were() -> None:
    """Under a byte bound ordinary writes stay far below, correlation is exactly what it is without one."""

    def run(max_bytes: int | None) -> tuple[list[str | None], dict[str, int]]:
        rc = RowCorrelator(history_per_entity=4, max_bytes=max_bytes)
        for i in range(200):
            rc.add_access(write(T1 if i % 2 else T2, entity=f"orders:{i % 50}", tx=str(i)))
        found = [rc.correlate(change(key=(("id", i % 50),), tx=str(i), commit_ms=50_000)) for i in range(200)]
        return [f.access.tx_id if f else None for f in found], {k: v for k, v in rc.telemetry.dropped.items() if v}

    assert run(1 << 20) == run(None)


def test_redelivery_is_judged_against_what_the_bounded_history_still_holds() -> None:
    """Duplicates are found by (trace, span) without a scan; evicting or pruning a write forgets it there too, so a
    redelivery of an evicted write is remembered again (as a scan of the history would have it)."""
    rc = RowCorrelator(history_per_entity=2)
    first, second, third = (write(T1, tx=tx) for tx in ("1", "2", "3"))
    for a in (first, second, third, second):
        rc.add_access(a)
    assert rc.counters["duplicate_accesses"] == 1  # `second` again; `first` was evicted by `third`
    rc.add_access(first)
    assert rc.counters["duplicate_accesses"] == 1 and rc.telemetry.dropped["history_per_entity"] == 2
    assert rc.correlate(change(tx="1", commit_ms=50_000)) is not None
    assert rc.prune(10**20) == 2 and len(rc) == 0
    rc.add_access(third)
    assert rc.counters["duplicate_accesses"] == 1


def test_prune_forgets_writes_no_waiting_change_can_be_credited_to() -> None:
    """Writes that ended before the horizon go, and rows left with none; newer writes stay and still credit."""
    rc = RowCorrelator()
    for i in range(50):
        rc.add_access(write(T1, entity=f"orders:{i}", tx=str(i), start_ms=1000 + i, end_ms=1010 + i))
    rc.add_access(write(T1, entity="orders:99", tx="99", start_ms=5000, end_ms=5010))
    assert rc.prune(5000 * MS) == 50
    assert len(rc) == 1 and rc.counters["pruned"] == 1
    assert rc.correlate(change(key=(("id", 99),), tx="99", commit_ms=5011)) is not None
    assert rc.correlate(change(key=(("id", 3),), tx="3", commit_ms=1014)) is None


def test_a_write_whose_change_has_not_come_is_kept_until_debeziums_lag_bound() -> None:
    """With a lag bound, the writes a change of their row has followed go at the usual horizon; a write no change
    has followed yet (Debezium behind) stays until the bound and is credited when its change comes, then goes;
    a predicate write waits for a change of any row of its table; a write on a table Debezium never sent a change
    of does not wait."""
    rc = RowCorrelator()
    for i in range(50):
        rc.add_access(write(T1, entity=f"orders:{i}", tx=str(i), start_ms=1000 + i, end_ms=1010 + i))
    rc.add_access(write(T2, entity="orders:*", tx="p", start_ms=1100, end_ms=1110))
    rc.add_access(write(T2, entity="payments:1", tx="q", start_ms=1100, end_ms=1110))  # a table not captured
    for i in range(0, 50, 2):  # the even rows' changes came
        assert rc.correlate_many([change(key=(("id", i),), tx=str(i), commit_ms=1011 + i)])[0][1] is not None
    assert rc.prune(5000 * MS, 900 * MS) == 26 and len(rc) == 26  # the odd rows and the predicate write wait
    [(_, late)] = rc.correlate_many([change(key=(("id", 7),), tx="7", commit_ms=1018)])
    assert late is not None and late.access.entity == "orders:7"
    assert rc.prune(5000 * MS, 900 * MS) == 1 and len(rc) == 25  # row 7's write went: its change came
    rc.correlate_many([change(key=(("id", 49),), tx="49", commit_ms=1120)])
    assert rc.prune(5000 * MS, 900 * MS) == 2 and len(rc) == 23  # row 49's, and the predicate write (ended at
    # 1,110 ms): a change of its table (row 49's) came after it
    assert rc.prune(60_000 * MS, 60_000 * MS) == 23 and len(rc) == 0  # the bound passed: the rest go


def test_extracted_insert_by_identity_correlates_with_serial_key() -> None:
    ex = SqlAccessExtractor(insert_identity={"charges": ["order_id"]})
    span = Span(
        trace_id=T1,
        span_id="00f067aa0ba902b7",
        parent_id="53995c3f42cd8ad8",
        name="INSERT shop.charges",
        kind=SpanKind.CLIENT,
        start_ns=1000 * MS,
        end_ns=1010 * MS,
        status=StatusCode.UNSET,
        resource=Resource(service="checkout"),
        db=DbCall("postgresql", "INSERT INTO charges (order_id, amount) VALUES (%s, %s)", params=("8812", 12.5)),
    )
    rc = RowCorrelator()
    for a in ex.accesses(span):
        rc.add_access(a)
    row = change(
        op=CdcOp.CREATE,
        table="public.charges",
        key=(("id", 501),),
        after={"id": 501, "order_id": 8812, "amount": "12.50"},
    )
    got = rc.correlate(row)
    assert got is not None and (got.access.entity, got.strength) == ("charges:order_id=8812", "values_time")
    assert rc.correlate(change(op=CdcOp.CREATE, table="public.charges", after={"order_id": 1})) is None


def test_entity_key_normalisation_str_param_vs_int_key() -> None:
    ex = SqlAccessExtractor()
    span = Span(
        trace_id=T1,
        span_id="00f067aa0ba902b7",
        parent_id="",
        name="UPDATE",
        kind=SpanKind.CLIENT,
        start_ns=1000 * MS,
        end_ns=1010 * MS,
        status=StatusCode.UNSET,
        resource=Resource(service="checkout"),
        db=DbCall("postgresql", "UPDATE orders SET status = $1 WHERE id = $2", params=("paid", "8812"), tx_id="44"),
    )
    rc = RowCorrelator()
    for a in ex.accesses(span):
        rc.add_access(a)
    got = rc.correlate(change(key=(("id", Decimal("8812")),), tx="44"))
    assert got is not None and got.strength == "tx_id"


@pytest.mark.parametrize(
    ("bound", "stored", "expected"),
    [
        (3, "3", True),
        ("12.50", Decimal("12.5"), True),
        (12.5, 12.5, True),
        (True, "t", True),
        (1, True, True),
        (False, True, False),
        ("paid", "pending", False),
        (None, None, True),
        (None, "x", False),
        ("2024-01-01T00:00:00Z", 1704067200000000, None),
        ("x", "__debezium_unavailable_value", None),
    ],
)
def test_same_value_normalisation(bound: Any, stored: Any, expected: bool | None) -> None:
    assert same_value(bound, stored) is expected


def test_a_replayed_change_gets_the_writer_it_got_the_first_time() -> None:
    """Crediting is idempotent: a change delivered again (a replay after a restart or a rebalance) is credited to
    the same writer, while an access that made one change is still not credited with a different one."""
    rc = RowCorrelator()
    a = write(T1)
    rc.add_access(a)
    first = change(after={"id": 8812, "status": "paid", "trace_id": T1})
    [(_, got)] = rc.correlate_many([first])
    assert got is not None and got.access == a
    [(_, again)] = rc.correlate_many([first])  # the same change (row, lsn, commit time) once more
    assert again is not None and (again.access, again.strength) == (a, got.strength)
    other = replace(first, lsn=2, commit_ts_ms=first.commit_ts_ms + 1)
    [(_, none)] = rc.correlate_many([other])  # a second change cannot have been made by the same statement
    assert none is None


def test_copies_of_tied_changes_delivered_together_are_matched_as_one_change_each() -> None:
    """Two writers set the same value and both commits match both on values and time: commit order decides. When
    each change arrives twice before either is credited (a replay after a crash), the copies are still two
    changes, not four: each copy gets its change's writer."""
    rc = RowCorrelator()
    a = write(T1, sets=(("status", "cancelled"),), end_ms=1004)
    b = write(T2, sets=(("status", "cancelled"),), end_ms=1006)
    rc.add_access(a)
    rc.add_access(b)
    first = change(after={"id": 8812, "status": "cancelled"}, commit_ms=1005)
    second = replace(first, lsn=2, commit_ts_ms=1007)
    got = rc.correlate_many([first, second, first, second])
    assert [(c.lsn, f.access if f else None) for c, f in got] == [(1, a), (1, a), (2, b), (2, b)]
    assert {f.strength for _, f in got if f} == {"commit_order"}
