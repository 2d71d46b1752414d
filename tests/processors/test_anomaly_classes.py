"""Each anomaly class from its dependencies, through predicate statements and credited commits, and its controls.

Histories are built the way stage 2 sees them: keyed accesses on rows, predicate accesses on a table's scope
(``table:*``), and committed row changes credited to the statement that made them.
"""

from __future__ import annotations

from itertools import count
from typing import Any

from processors.detectors.collisions import CollisionDetector
from processors.detectors.collisions.views import Collision
from processors.lib.invariants import Invariant
from processors.model.events import Access, CdcOp, Commit, DbOperation, LockMode, RowChange, scope_key

MS = 1_000_000
T0 = 1_800_000_000_000 * MS
_spans = count(1)


def access(trace: str, op: DbOperation, at_ms: float, table: str, *, key: str = "", statement: str = "",
           predicates: tuple[tuple[str, str, Any], ...] = (), sets: tuple[tuple[str, Any], ...] = (),
           exprs: tuple[str, ...] = (), lock: LockMode = LockMode.NONE, function: str = "",
           failed: bool = False) -> Access:  # fmt: skip
    start = T0 + int(at_ms * MS)
    return Access(
        entity=f"{table}:{key}" if key else scope_key(table), table=table, operation=op, lock=lock,
        trace_id=trace * 32, span_id=f"{next(_spans):016x}", service="app", version="1", start_ns=start,
        end_ns=start + MS, statement=statement or f"{op.value} {table}", set_values=sets, predicates=predicates,
        function=function or f"fn_{trace}", keyed=bool(key), set_exprs=exprs, trace_error=failed,
        trace_exception="Oversold" if failed else "", request_start_ns=start - 5 * MS, request_end_ns=start + 60 * MS,
    )  # fmt: skip


class History:
    def __init__(self, **kw: Any) -> None:
        self.d = CollisionDetector(window_ns=500 * MS, settle_ns=0, **kw)
        self.lsn = 0

    def add(self, *accesses: Access) -> None:
        for a in accesses:
            self.d.on_access(a)

    def commit(self, by: Access, row: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
               at_ms: float, *, tx: str = "") -> None:  # fmt: skip
        self.lsn += 1
        table, _, key = row.partition(":")
        op = CdcOp.CREATE if before is None else CdcOp.DELETE if after is None else CdcOp.UPDATE
        change = RowChange(table=f"public.{table}", op=op, key=(("k", key),), before=before, after=after,
                           commit_ts_ms=T0 // MS + int(at_ms), ts_ms=0, lsn=self.lsn,
                           tx_id=tx or str(self.lsn))  # fmt: skip
        self.d.on_commit(row, Commit(change, by.trace_id, by.span_id, "values_time"))

    def found(self) -> list[Collision]:
        return self.d.close_until(T0 + 10_000 * MS)


READ, WRITE, INSERT = DbOperation.READ, DbOperation.WRITE, DbOperation.INSERT


# ---- one row ---------------------------------------------------------------------------------------------------


def _decrements(*, failed: bool) -> list[Collision]:
    h = History()
    ra = access("a", READ, 0, "stock", key="x", function="buy")
    rb = access("b", READ, 1, "stock", key="x", function="buy")
    wa = access("a", WRITE, 3, "stock", key="x", sets=(("qty", "qty - 1"),), exprs=("qty",), function="buy")
    wb = access("b", WRITE, 4, "stock", key="x", sets=(("qty", "qty - 1"),), exprs=("qty",), function="buy",
                failed=failed)  # fmt: skip
    h.add(ra, rb, wa, wb)
    h.commit(wa, "stock:x", {"qty": 1}, {"qty": 0}, 10)
    h.commit(wb, "stock:x", {"qty": 0}, {"qty": -1}, 11)
    return h.found()


def test_two_relative_updates_are_never_a_lost_update() -> None:
    assert _decrements(failed=False) == []


def test_a_relative_update_whose_check_failed_is_an_invariant_violation() -> None:
    [c] = _decrements(failed=True)
    assert (c.anomaly, c.adya, c.manifest) == ("invariant_violation", "G-single", True)
    assert c.victim.trace_id == "b" * 32 and c.culprit.trace_id == "a" * 32
    assert "victim failed: Oversold" in c.damage


def test_lost_update_through_predicate_statements_of_a_table_whose_key_is_not_known_yet() -> None:
    """Before Debezium named the key, ``WHERE id = %s`` is a predicate: the read covers the row's image and the
    writes are known by the changes credited to them. Same class as with keys."""
    h = History()
    pred = (("id", "=", 7),)
    ra = access("a", READ, 0, "orders", predicates=pred)
    rb = access("b", READ, 1, "orders", predicates=pred)
    wa = access("a", WRITE, 3, "orders", predicates=pred, sets=(("status", "cancelled"),))
    wb = access("b", WRITE, 4, "orders", predicates=pred, sets=(("status", "paid"),))
    h.add(ra, rb, wa, wb)
    h.commit(wa, "orders:7", {"id": 7, "status": "pending"}, {"id": 7, "status": "cancelled"}, 10)
    h.commit(wb, "orders:7", {"id": 7, "status": "cancelled"}, {"id": 7, "status": "paid"}, 11)
    [c] = h.found()
    assert (c.anomaly, c.entity, c.manifest) == ("lost_update", "orders:7", True)
    assert "status = 'cancelled' overwritten by 'paid'" in c.damage


def test_oversell_through_predicate_statements_whose_changes_could_not_be_credited() -> None:
    """Two checkouts of the last unit before Debezium named the table's key: ``UPDATE ... SET stock = stock - 1
    WHERE sku = %s`` is a predicate write that brings no value, so its two changes match both writers equally and
    stay uncredited. Each write's WHERE selected the row's image when it started: it wrote that row. The oversell
    is found (CI missed the first of three oversells when the seed's row change came after the first round)."""
    h = History(invariants={"inventory": [Invariant("stock >= 0")]})
    pred = (("sku", "=", "s-1"),)
    ra = access("a", READ, 0, "inventory", predicates=pred, function="checkout")
    rb = access("b", READ, 1, "inventory", predicates=pred, function="checkout")
    wa = access("a", WRITE, 3, "inventory", predicates=pred, exprs=("stock",), function="checkout")
    wb = access("b", WRITE, 4, "inventory", predicates=pred, exprs=("stock",), function="checkout")
    h.add(ra, rb, wa, wb)
    for lsn, (before, after, at) in enumerate([(1, 0, 10), (0, -1, 11)], 1):
        change = RowChange(table="public.inventory", op=CdcOp.UPDATE, key=(("sku", "s-1"),),
                           before={"sku": "s-1", "stock": before}, after={"sku": "s-1", "stock": after},
                           commit_ts_ms=T0 // MS + at, ts_ms=0, lsn=lsn, tx_id=str(lsn))  # fmt: skip
        h.d.on_commit("inventory:s-1", Commit(change))  # uncredited: ambiguous between the two writers
    [c] = h.found()
    assert (c.anomaly, c.entity, c.manifest, c.correlated) == ("invariant_violation", "inventory:s-1", True, False)
    assert "stock = -1 violates stock >= 0" in c.damage


def test_a_predicate_write_that_did_not_select_the_row_is_not_a_write_of_it() -> None:
    """The control: the same statements on another sku's row leave this row alone."""
    h = History(invariants={"inventory": [Invariant("stock >= 0")]})
    pred = (("sku", "=", "s-2"),)
    h.add(access("a", READ, 0, "inventory", predicates=pred), access("b", READ, 1, "inventory", predicates=pred),
          access("a", WRITE, 3, "inventory", predicates=pred, exprs=("stock",)),
          access("b", WRITE, 4, "inventory", predicates=pred, exprs=("stock",)))  # fmt: skip
    change = RowChange(table="public.inventory", op=CdcOp.UPDATE, key=(("sku", "s-1"),),
                       before={"sku": "s-1", "stock": 0}, after={"sku": "s-1", "stock": -1},
                       commit_ts_ms=T0 // MS + 11, ts_ms=0, lsn=1, tx_id="1")  # fmt: skip
    h.d.on_commit("inventory:s-1", Commit(change))
    assert h.found() == []


# ---- write skew --------------------------------------------------------------------------------------------------

ON_CALL = (("shift", "=", 1), ("on_call", "=", True))


def _doctors(*, lock: LockMode = LockMode.NONE, second_commits: bool = True) -> list[Collision]:
    h = History()
    # An older predicate read of the table (another shift) makes the table's scope due before the rows: judging
    # everything in one late watermark must still judge the rows before the scope is pruned.
    h.add(access("z", READ, -1000, "doctors", predicates=(("shift", "=", 9),)))
    ra = access("a", READ, 0, "doctors", predicates=ON_CALL, lock=lock, function="go_off_call")
    rb = access("b", READ, 1, "doctors", predicates=ON_CALL, lock=lock, function="go_off_call")
    wa = access("a", WRITE, 3, "doctors", key="alice", sets=(("on_call", False),), function="go_off_call")
    wb = access("b", WRITE, 4, "doctors", key="bob", sets=(("on_call", False),), function="go_off_call")
    h.add(ra, rb, wa, wb)
    h.commit(wa, "doctors:alice", {"name": "alice", "shift": 1, "on_call": True},
             {"name": "alice", "shift": 1, "on_call": False}, 20)  # fmt: skip
    if second_commits:
        h.commit(wb, "doctors:bob", {"name": "bob", "shift": 1, "on_call": True},
                 {"name": "bob", "shift": 1, "on_call": False}, 21)  # fmt: skip
    return h.found()


def test_write_skew_through_a_predicate_read() -> None:
    [c] = _doctors()
    assert (c.anomaly, c.adya, c.manifest) == ("write_skew", "G2-item", True)
    assert c.entities == ("doctors:alice", "doctors:bob")
    assert (c.culprit.trace_id, c.victim.trace_id) == ("a" * 32, "b" * 32)
    assert len(c.commits) == 2 and "both committed" in c.damage


def test_write_skew_controls() -> None:
    assert _doctors(lock=LockMode.FOR_UPDATE) == []  # the second waits, re-reads and refuses
    assert _doctors(second_commits=False) == []  # SERIALIZABLE: the second never commits


def test_write_skew_fingerprint_is_stable_whichever_commits_first() -> None:
    first = _doctors()[0]
    h = History()
    rb = access("b", READ, 0, "doctors", predicates=ON_CALL, function="go_off_call")
    ra = access("a", READ, 1, "doctors", predicates=ON_CALL, function="go_off_call")
    wb = access("b", WRITE, 3, "doctors", key="carol", sets=(("on_call", False),), function="go_off_call")
    wa = access("a", WRITE, 4, "doctors", key="dave", sets=(("on_call", False),), function="go_off_call")
    h.add(rb, ra, wb, wa)
    h.commit(wb, "doctors:carol", {"shift": 1, "on_call": True}, {"shift": 1, "on_call": False}, 20)
    h.commit(wa, "doctors:dave", {"shift": 1, "on_call": True}, {"shift": 1, "on_call": False}, 21)
    [again] = h.found()
    assert again.fingerprint == first.fingerprint and again.occurrence != first.occurrence


# ---- phantom ---------------------------------------------------------------------------------------------------

ROOM = (("room", "=", 5), ("day", "=", "2026-12-01"))


def _bookings(*, both_insert: bool = True) -> list[Collision]:
    h = History()
    ra = access("a", READ, 0, "bookings", predicates=ROOM, function="book")
    rb = access("b", READ, 1, "bookings", predicates=ROOM, function="book")
    ia = access(
        "a", INSERT, 3, "bookings", sets=(("room", 5), ("day", "2026-12-01"), ("guest", "ann")), function="book"
    )
    ib = access("b", INSERT, 4, "bookings", sets=(("room", 5), ("day", "2026-12-01"), ("guest", "bo")), function="book")
    h.add(ra, rb, ia, ib)
    h.commit(ia, "bookings:17", None, {"booking_id": 17, "room": 5, "day": "2026-12-01", "guest": "ann"}, 20)
    if both_insert:
        h.commit(ib, "bookings:18", None, {"booking_id": 18, "room": 5, "day": "2026-12-01", "guest": "bo"}, 21)
    return h.found()


def test_predicate_double_insert_is_a_phantom() -> None:
    [c] = _bookings()
    assert (c.anomaly, c.adya, c.manifest) == ("phantom", "G2", True)
    assert c.entities == ("bookings:17", "bookings:18")
    assert c.culprit.operation is INSERT and c.victim.trace_id == "b" * 32


def test_phantom_control_on_conflict_inserts_once() -> None:
    assert _bookings(both_insert=False) == []


# ---- read skew -------------------------------------------------------------------------------------------------


def _audit(*, one_statement: bool = False) -> list[Collision]:
    h = History()
    wa = access("t", WRITE, 0, "ledger", key="a", sets=(("balance", "balance - 10"),), exprs=("balance",),
                function="transfer")  # fmt: skip
    wb = access("t", WRITE, 1, "ledger", key="b", sets=(("balance", "balance + 10"),), exprs=("balance",),
                function="transfer")  # fmt: skip
    if one_statement:
        reads = [access("u", READ, 40, "ledger", predicates=(("acct", "IN", ("a", "b")),), function="audit")]
    else:
        reads = [access("u", READ, 0, "ledger", key="a", function="audit"),
                 access("u", READ, 40, "ledger", key="b", function="audit", failed=True)]  # fmt: skip
    h.add(wa, wb, *reads)
    h.commit(wa, "ledger:a", {"acct": "a", "balance": 50}, {"acct": "a", "balance": 40}, 20, tx="9")
    h.commit(wb, "ledger:b", {"acct": "b", "balance": 50}, {"acct": "b", "balance": 60}, 20, tx="9")
    return h.found()


def test_reading_two_rows_around_a_transaction_is_read_skew() -> None:
    [c] = _audit()
    assert (c.anomaly, c.adya, c.manifest) == ("read_skew", "G-single", True)
    assert c.culprit.function == "transfer" and c.victim.function == "audit"
    assert c.entities == ("ledger:a", "ledger:b")


def test_read_skew_control_one_statement() -> None:
    assert _audit(one_statement=True) == []
