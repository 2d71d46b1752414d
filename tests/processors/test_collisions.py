"""The collision detector over hand-built histories: each anomaly class, latent vs manifest, and properties."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.api.component import Emit
from processors.detectors.collisions import CollisionDetector
from processors.lib.invariants import Invariant
from processors.model.events import Access, CdcOp, Commit, DbOperation, LockMode, RowChange
from processors.state.lru import CountedLRU

MS = 1_000_000
T0 = 1_800_000_000_000 * MS  # an event time in 2027


def acc(trace: str, op: DbOperation, at_ms: float, *, entity: str = "orders:1", lock: LockMode = LockMode.NONE,
        function: str = "", statement: str = "", set_values: tuple[tuple[str, object], ...] = (),
        trace_error: bool = False, links: tuple[str, ...] = ()) -> Access:  # fmt: skip
    table = entity.split(":", 1)[0]
    default = {DbOperation.READ: f"SELECT * FROM {table} WHERE id = %s", DbOperation.WRITE:
               f"UPDATE {table} SET status = %s WHERE id = %s", DbOperation.INSERT:
               f"INSERT INTO {table} (order_id, amount) VALUES (%s, %s)"}  # fmt: skip
    start = T0 + int(at_ms * MS)
    return Access(
        entity=entity, table=table, operation=op, lock=lock, trace_id=trace * 32, span_id=f"{trace}{int(at_ms):015d}",
        service="shop", version="1", start_ns=start, end_ns=start + MS, statement=statement or default.get(op, ""),
        set_values=set_values, function=function or f"fn_{trace}", trace_error=trace_error,
        links=tuple(t * 32 for t in links), route=f"/{trace}", request_start_ns=start - 5 * MS,
        request_end_ns=start + 50 * MS,
    )  # fmt: skip


def change(lsn: int, before: dict[str, object] | None, after: dict[str, object] | None, at_ms: float,
           op: CdcOp = CdcOp.UPDATE, table: str = "public.orders") -> RowChange:  # fmt: skip
    return RowChange(table=table, op=op, key=(("id", 1),), before=before, after=after,
                     commit_ts_ms=(T0 // MS) + int(at_ms), ts_ms=0, lsn=lsn, tx_id=str(lsn))  # fmt: skip


def detector(**kw: object) -> CollisionDetector:
    return CollisionDetector(window_ns=500 * MS, settle_ns=0, **kw)  # type: ignore[arg-type]


def commit(d: CollisionDetector, entity: str, lsn: int, before: dict[str, object] | None,
           after: dict[str, object] | None, at_ms: float, by: Access, *, tx: str = "") -> None:  # fmt: skip
    """A committed change of ``entity`` credited to the access ``by``."""
    table, _, key = entity.partition(":")
    op = CdcOp.CREATE if before is None else CdcOp.UPDATE
    row = RowChange(table=f"public.{table}", op=op, key=(("id", key),), before=before, after=after,
                    commit_ts_ms=(T0 // MS) + int(at_ms), ts_ms=0, lsn=lsn, tx_id=tx or str(lsn))  # fmt: skip
    d.on_commit(entity, Commit(row, by.trace_id, by.span_id, "values_time"))


def judge(d: CollisionDetector, accesses: list[Access]) -> list:  # type: ignore[type-arg]
    for a in accesses:
        d.on_access(a)
    return d.close_until(T0 + 10_000 * MS)


def test_lost_update_r1_r2_w1_w2() -> None:
    """r1(x0) r2(x0) w1(x1) w2(x2): a lost update; the culprit is the first write, the victim the second."""
    d = detector()
    history = [
        acc("a", DbOperation.READ, 0, function="expire_cart"),
        acc("b", DbOperation.READ, 2, function="capture_payment"),
        acc("a", DbOperation.WRITE, 5, function="expire_cart", set_values=(("status", "cancelled"),)),
        acc("b", DbOperation.WRITE, 9, function="capture_payment", set_values=(("status", "paid"),)),
    ]
    d.on_commit(
        "orders:1", Commit(change(10, {"status": "pending"}, {"status": "cancelled"}, 6), "a" * 32, "", "tx_id")
    )
    d.on_commit("orders:1", Commit(change(11, {"status": "cancelled"}, {"status": "paid"}, 10), "b" * 32, "", "tx_id"))
    [c] = judge(d, history)
    assert c.anomaly == "lost_update"
    assert c.culprit.function == "expire_cart" and c.victim.function == "capture_payment"
    assert c.manifest and "status = 'cancelled' overwritten by 'paid'" in c.damage
    assert [w.function for w in c.writers] == ["expire_cart", "capture_payment"]
    assert c.entity == "orders:1" and c.window_ms == 10.0


def test_victim_is_the_failed_request_never_the_culprit() -> None:
    """When the second writer's request failed, it is the victim and the other trace's write is the culprit."""
    d = detector()
    history = [
        acc("a", DbOperation.READ, 0, function="capture_payment", trace_error=True),
        acc("b", DbOperation.READ, 1, function="expire_cart"),
        acc("b", DbOperation.WRITE, 3, function="expire_cart"),
        acc("a", DbOperation.WRITE, 4, function="capture_payment", trace_error=True),
    ]
    [c] = judge(d, history)
    assert c.victim.function == "capture_payment" and c.culprit.function == "expire_cart"
    assert c.manifest and c.damage.startswith("victim failed")


def test_same_value_overwrite_is_latent() -> None:
    """Two unprotected read-modify-writes that wrote the same value lost nothing: a latent incident."""
    d = detector()
    history = [acc("a", DbOperation.READ, 0), acc("b", DbOperation.READ, 1),
               acc("a", DbOperation.WRITE, 2, set_values=(("status", "paid"),)),
               acc("b", DbOperation.WRITE, 3, set_values=(("status", "paid"),))]  # fmt: skip
    d.on_commit("orders:1", Commit(change(1, {"status": "pending"}, {"status": "paid"}, 2), "a" * 32))
    d.on_commit("orders:1", Commit(change(2, {"status": "paid"}, {"status": "paid"}, 3), "b" * 32))
    [c] = judge(d, history)
    assert c.anomaly == "lost_update" and not c.manifest


def test_locked_reads_and_guarded_writes_are_not_collisions() -> None:
    """FOR UPDATE reads, atomic conditional updates and optimistic version checks protect the row."""
    for read_lock, write_lock in [(LockMode.FOR_UPDATE, LockMode.NONE), (LockMode.NONE, LockMode.ATOMIC),
                                  (LockMode.NONE, LockMode.OPTIMISTIC)]:  # fmt: skip
        d = detector()
        history = [
            acc("a", DbOperation.READ, 0, lock=read_lock),
            acc("b", DbOperation.READ, 1, lock=read_lock),
            acc("a", DbOperation.WRITE, 2, lock=write_lock),
            acc("b", DbOperation.WRITE, 3, lock=write_lock),
        ]
        assert judge(d, history) == []


def test_oversell_is_an_invariant_violation() -> None:
    """Two read-check-decrements of the last unit: the after-image breaks stock >= 0."""
    d = detector(invariants={"inventory": [Invariant("stock >= 0")]})
    e = "inventory:sku-1"
    history = [acc("a", DbOperation.READ, 0, entity=e), acc("b", DbOperation.READ, 1, entity=e),
               acc("a", DbOperation.WRITE, 2, entity=e), acc("b", DbOperation.WRITE, 3, entity=e)]  # fmt: skip
    d.on_commit(e, Commit(change(5, {"stock": 1}, {"stock": 0}, 3, table="public.inventory"), "a" * 32))
    d.on_commit(e, Commit(change(6, {"stock": 0}, {"stock": -1}, 4, table="public.inventory"), "b" * 32))
    [c] = judge(d, history)
    assert c.anomaly == "invariant_violation" and c.manifest
    assert "stock = -1 violates stock >= 0" in c.damage
    assert c.invariant == "stock >= 0"  # typed, for the repro compiler: never read back from the damage


def test_retried_insert_is_a_duplicate_apply() -> None:
    """A client retry inserting the same charge twice, both committed: duplicate apply."""
    d = detector()
    e = "charges:order_id=8812"  # sql.insert_identity names the logical row
    history = [acc("a", DbOperation.READ, 0, entity=e), acc("a", DbOperation.INSERT, 1, entity=e),
               acc("b", DbOperation.READ, 30, entity=e), acc("b", DbOperation.INSERT, 31, entity=e)]  # fmt: skip
    for lsn, at in ((1, 2), (2, 32)):
        d.on_commit(e, Commit(change(lsn, None, {"order_id": 8812}, at, CdcOp.CREATE, "public.charges")))
    [c] = judge(d, history)
    assert c.anomaly == "duplicate_apply" and c.manifest
    assert c.culprit.trace_id == "a" * 32 and c.victim.trace_id == "b" * 32


def test_upsert_with_idempotency_key_is_not_a_duplicate() -> None:
    """INSERT ... ON CONFLICT DO NOTHING is an idempotency guard."""
    d = detector()
    e = "charges:8812"
    history = [acc("a", DbOperation.INSERT, 1, entity=e, lock=LockMode.UPSERT),
               acc("b", DbOperation.INSERT, 2, entity=e, lock=LockMode.UPSERT)]  # fmt: skip
    assert judge(d, history) == []


def test_write_skew_over_two_rows() -> None:
    """Both traces read x and y; one writes x, the other y, and both commit: G2-item write skew, found once."""
    d = detector()
    x, y = "oncall:1", "oncall:2"
    history = [acc("a", DbOperation.READ, 0, entity=x), acc("a", DbOperation.READ, 1, entity=y),
               acc("b", DbOperation.READ, 2, entity=x), acc("b", DbOperation.READ, 3, entity=y),
               acc("a", DbOperation.WRITE, 5, entity=x), acc("b", DbOperation.WRITE, 6, entity=y)]  # fmt: skip
    commit(d, x, 1, {"on": True}, {"on": False}, 15, history[4])
    commit(d, y, 2, {"on": True}, {"on": False}, 16, history[5])
    [c] = judge(d, history)
    assert (c.anomaly, c.adya, c.entities, c.manifest) == ("write_skew", "G2-item", (x, y), True)
    assert c.culprit.trace_id == "a" * 32 and c.victim.trace_id == "b" * 32
    assert [x.change.lsn for x in c.commits] == [1, 2]


def test_write_skew_needs_both_commits() -> None:
    """The second transaction failed to commit (SERIALIZABLE refused it): no cycle, no incident."""
    d = detector()
    x, y = "oncall:1", "oncall:2"
    history = [acc("a", DbOperation.READ, 0, entity=x), acc("a", DbOperation.READ, 1, entity=y),
               acc("b", DbOperation.READ, 2, entity=x), acc("b", DbOperation.READ, 3, entity=y),
               acc("a", DbOperation.WRITE, 5, entity=x),
               acc("b", DbOperation.WRITE, 6, entity=y, trace_error=True)]  # fmt: skip
    commit(d, x, 1, {"on": True}, {"on": False}, 15, history[4])
    assert judge(d, history) == []


def test_linked_traces_are_not_independent() -> None:
    """A job trace linked to the request that enqueued it is its descendant: no collision between them."""
    d = detector()
    history = [acc("a", DbOperation.READ, 0), acc("b", DbOperation.READ, 1, links=("a",)),
               acc("a", DbOperation.WRITE, 2), acc("b", DbOperation.WRITE, 3, links=("a",))]  # fmt: skip
    assert judge(d, history) == []


def test_fingerprint_is_stable_across_occurrences_and_roles() -> None:
    """Two occurrences on different rows, with the writers in either order, share one fingerprint."""
    d = detector()
    read, write = DbOperation.READ, DbOperation.WRITE
    f_first = [acc("a", read, 0, function="f"), acc("b", read, 1, function="g"),
               acc("a", write, 2, function="f"), acc("b", write, 3, function="g")]  # fmt: skip
    e = "orders:2"
    g_first = [acc("c", read, 0, function="g", entity=e), acc("d", read, 1, function="f", entity=e),
               acc("c", write, 2, function="g", entity=e), acc("d", write, 3, function="f", entity=e)]  # fmt: skip
    found = judge(d, f_first + g_first)
    assert len(found) == 2
    assert {c.culprit.function for c in found} == {"f", "g"}
    assert len({c.fingerprint for c in found}) == 1
    assert len({c.occurrence for c in found}) == 2


@st.composite
def serial_history(draw: st.DrawFn) -> list[Access]:
    """Traces that each read-modify-write rows one after another, never overlapping."""
    n = draw(st.integers(2, 6))
    entities = draw(st.lists(st.sampled_from(["orders:1", "orders:2", "inventory:a"]), min_size=n, max_size=n))
    out, t = [], 0.0
    for i, e in enumerate(entities):
        trace = "abcdef"[i]
        out.append(acc(trace, DbOperation.READ, t, entity=e))
        out.append(acc(trace, DbOperation.WRITE, t + 2, entity=e))
        t += draw(st.floats(4, 200))
    return out


@settings(max_examples=200, deadline=None)
@given(serial_history())
def test_serial_history_is_never_flagged(history: list[Access]) -> None:
    """A serial history (each trace's reads and writes finish before the next begins) has no collision."""
    assert judge(detector(), history) == []


@settings(max_examples=100, deadline=None)
@given(st.permutations(range(3)))
def test_permuting_independent_entities_changes_nothing(order: list[int]) -> None:
    """Feeding the histories of independent entities in any order finds the same collisions."""
    blocks = []
    for i in range(3):
        e = f"orders:{i}"
        blocks.append([acc("a", DbOperation.READ, 0, entity=e), acc("b", DbOperation.READ, 1, entity=e),
                       acc("a", DbOperation.WRITE, 2, entity=e), acc("b", DbOperation.WRITE, 3, entity=e)])  # fmt: skip
    baseline = sorted(c.occurrence for c in judge(detector(), [x for b in blocks for x in b]))
    permuted = sorted(c.occurrence for c in judge(detector(), [x for i in order for x in blocks[i]]))
    assert permuted == baseline and len(baseline) == 3


def test_judged_rows_and_old_traces_are_forgotten() -> None:
    """Once event time is far past them, a row's history and its traces go: the state does not grow with traffic."""
    d = detector()
    for i in range(20):
        e = f"orders:{i}"
        judge(d, [acc(f"{i:x}", DbOperation.READ, i * 10, entity=e), acc(f"{i:x}", DbOperation.WRITE, i * 10 + 2,
                                                                          entity=e)])  # fmt: skip
    assert d.close_until(T0 + 100_000 * MS) == []
    assert len(d) == 0 and d.telemetry.state["rows"] == 0 and d.telemetry.state["traces"] == 0


def test_a_row_judged_before_it_is_old_enough_to_forget_is_forgotten_later() -> None:
    """A row judged as soon as the watermark passed it (its history still young) is pruned by a later watermark
    without any new event on it: the soak's row count grew with every distinct row the traffic touched."""
    d = detector()
    for i in range(20):
        e = f"orders:{i}"
        for a in (acc(f"{i:x}", DbOperation.READ, i * 10, entity=e), acc(f"{i:x}", DbOperation.WRITE, i * 10 + 2,
                                                                       entity=e)):  # fmt: skip
            d.on_access(a)
    assert d.close_until(T0 + 1_300 * MS) == []  # judged: past window + settle, not yet past the pruning horizon
    assert d.telemetry.state["rows"] == 20
    assert d.close_until(T0 + 100_000 * MS) == []
    assert len(d) == 0 and d.telemetry.state["rows"] == 0 and d.telemetry.state["traces"] == 0


def _checkouts(e: str) -> tuple[Access, ...]:
    """Two checkouts that both read the stock of ``e``, then both take a unit relative to the current value."""
    take = "UPDATE inventory SET stock = stock - 1 WHERE sku = %s"
    return (
        acc("a", DbOperation.READ, 0, entity=e),
        acc("b", DbOperation.READ, 1, entity=e),
        replace(acc("a", DbOperation.WRITE, 2, entity=e, statement=take), set_exprs=("stock = stock - 1",)),
        replace(acc("b", DbOperation.WRITE, 3, entity=e, statement=take), set_exprs=("stock = stock - 1",)),
    )


def test_row_changes_that_arrive_after_their_pair_was_judged_are_judged_with_it() -> None:
    """Debezium lagging past the settle time: the two checkouts were judged without their row changes (a relative
    decrement proves nothing alone); the changes arriving later, while the row's history lasts, re-judge the pair,
    and the oversell is found."""
    d = detector(invariants={"inventory": [Invariant("stock >= 0")]})
    e = "inventory:sku-1"
    for a in _checkouts(e):
        d.on_access(a)
    assert d.close_until(T0 + 600 * MS) == []  # judged: two relative decrements, nothing committed yet
    d.on_commit(e, Commit(change(5, {"stock": 1}, {"stock": 0}, 3, table="public.inventory"), "a" * 32))
    d.on_commit(e, Commit(change(6, {"stock": 0}, {"stock": -1}, 4, table="public.inventory"), "b" * 32))
    [c] = d.close_until(T0 + 700 * MS)
    assert c.anomaly == "invariant_violation" and c.manifest
    assert d.close_until(T0 + 800 * MS) == [] and d.counters["late_commits"] == 2


def test_a_late_statement_of_a_judged_trace_is_judged_against_the_others() -> None:
    """A trace's write that reached stage 2 after its read had been judged (its spans closed in two fragments)
    re-judges that trace's pairs: the lost update is found, once."""
    d = detector()
    early = [acc("a", DbOperation.READ, 0, function="expire_cart"), acc("b", DbOperation.READ, 2),
             acc("b", DbOperation.WRITE, 9, set_values=(("status", "paid"),))]  # fmt: skip
    for a in early:
        d.on_access(a)
    assert d.close_until(T0 + 600 * MS) == []
    d.on_access(acc("a", DbOperation.WRITE, 5, function="expire_cart", set_values=(("status", "cancelled"),)))
    [c] = d.close_until(T0 + 700 * MS)
    assert c.anomaly == "lost_update" and c.culprit.function == "expire_cart"
    assert d.close_until(T0 + 800 * MS) == []


def test_input_later_than_the_history_it_needed_is_counted() -> None:
    """A row change arriving after its row's history was pruned cannot be judged with it: it is counted."""
    d = detector()
    for a in (acc("a", DbOperation.READ, 0), acc("a", DbOperation.WRITE, 2)):
        d.on_access(a)
    assert d.close_until(T0 + 10_000 * MS) == [] and len(d) == 0
    d.on_commit("orders:1", Commit(change(5, {"status": "x"}, {"status": "y"}, 3), "a" * 32))
    assert d.counters["late_past_history"] == 1 and "late_commits" not in d.counters


def test_input_delivered_again_reopens_nothing() -> None:
    """A replay (a handover) delivers a judged trace's statements and row changes again: nothing is judged anew."""
    d = detector()
    history = [acc("a", DbOperation.READ, 0), acc("b", DbOperation.READ, 2), acc("b", DbOperation.WRITE, 9)]
    for a in history:
        d.on_access(a)
    again = Commit(change(11, {"status": "x"}, {"status": "y"}, 10), "b" * 32)
    d.on_commit("orders:1", again)
    assert d.close_until(T0 + 600 * MS) == []
    for a in history:
        d.on_access(a)
    d.on_commit("orders:1", again)
    assert d.close_until(T0 + 700 * MS) == []
    assert d.counters["redelivered"] == 4 and "late_accesses" not in d.counters and "late_commits" not in d.counters


def test_a_row_whose_write_has_no_change_yet_is_kept_until_debeziums_lag_bound() -> None:
    """With ``late_ns`` (``windows.max_cdc_lag_s``), a row written with no change of it seen since is kept past the
    usual two windows, so that the change, 20 s late, is judged with it: the silent oversell is found; then the row
    goes as usual."""
    d = detector(invariants={"inventory": [Invariant("stock >= 0")]}, late_ns=30_000 * MS)
    e = "inventory:sku-1"
    d.on_commit("inventory:sku-0", Commit(change(1, None, {"stock": 5}, -9_000, CdcOp.CREATE, "public.inventory")))
    for a in _checkouts(e):
        d.on_access(a)
    assert d.close_until(T0 + 10_000 * MS) == [] and len(d) == 1  # kept: its writes' changes have not come
    d.on_commit(e, Commit(change(5, {"stock": 1}, {"stock": 0}, 3, table="public.inventory")))
    d.on_commit(e, Commit(change(6, {"stock": 0}, {"stock": -1}, 4, table="public.inventory")))
    [c] = d.close_until(T0 + 20_000 * MS)
    assert c.anomaly == "invariant_violation" and "stock = -1" in c.damage
    assert d.close_until(T0 + 21_000 * MS) == [] and len(d) == 0  # its changes came: it goes as usual


def test_a_row_whose_changes_came_is_not_kept_longer_and_the_bound_ends_a_hold() -> None:
    """The hold costs nothing when Debezium keeps up: a row whose writes' changes came is forgotten two windows
    past its judging, as without ``late_ns``. A write whose change never comes (it matched no row, it rolled
    back) holds its row until the bound, no longer; one on a table Debezium does not capture, not at all."""
    d = detector(late_ns=30_000 * MS)
    w = acc("a", DbOperation.WRITE, 2, set_values=(("status", "paid"),))
    d.on_access(acc("a", DbOperation.READ, 0))
    d.on_access(w)
    d.on_commit("orders:1", Commit(change(5, {"status": "x"}, {"status": "paid"}, 3), w.trace_id, w.span_id))
    assert d.close_until(T0 + 3_000 * MS) == [] and len(d) == 0
    d = detector(late_ns=30_000 * MS)
    d.on_commit("orders:2", Commit(change(1, {"status": "x"}, {"status": "y"}, -9_000)))  # orders is captured
    d.on_access(acc("a", DbOperation.READ, 0))
    d.on_access(w)
    assert d.close_until(T0 + 3_000 * MS) == [] and len(d) == 1
    assert d.close_until(T0 + 30_000 * MS) == [] and len(d) == 1
    assert d.close_until(T0 + 31_000 * MS) == [] and len(d) == 0  # due at the bound (30.503 s), then gone
    d = detector(late_ns=30_000 * MS)  # a table Debezium never sent a change of: nothing waits for one
    d.on_access(acc("a", DbOperation.READ, 0))
    d.on_access(w)
    assert d.close_until(T0 + 3_000 * MS) == [] and len(d) == 0


class HeldKeys:
    """StateEvents that keeps the keys retained and not released yet."""

    def __init__(self) -> None:
        self.keys: set[tuple[str, object]] = set()

    def retained(self, store: str, key: object) -> None:
        self.keys.add((store, key))

    def released(self, store: str, key: object) -> None:
        self.keys.discard((store, key))


def test_a_row_whose_judging_raises_is_quarantined_and_every_other_incident_of_the_step_emitted() -> None:
    """Three rows with a lost update each, due in one step; judging the second one raises after its lost update was
    found (as a value no invariant can compare would). Every incident of the step is returned, that one included
    (it is marked reported: returned now or never), the failed row is reported quarantined with the input keys it
    held and dropped, every pin is released, and its next input starts a fresh history."""
    events = HeldKeys()
    d = detector(events=events)
    real = d.judge.judge

    def judge_raising(key: str, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        yield from real(key, *args, **kw)  # type: ignore[arg-type]
        if key == "orders:2":
            raise ArithmeticError("[<class 'decimal.InvalidOperation'>]")

    d.judge.judge = judge_raising  # type: ignore[method-assign]
    for row in (1, 2, 3):
        e, t = f"orders:{row}", f"{row}{row}"
        d.on_access(acc(f"a{t}", DbOperation.READ, row, entity=e))
        d.on_access(acc(f"b{t}", DbOperation.READ, row + 1, entity=e))
        d.on_access(acc(f"a{t}", DbOperation.WRITE, row + 3, entity=e))
        d.on_access(acc(f"b{t}", DbOperation.WRITE, row + 6, entity=e))
    out = Emit()
    d.on_watermark(T0 + 10_000 * MS, None, out)
    assert sorted((e.entity, e.anomaly) for e in out.events) == [(f"orders:{r}", "lost_update") for r in (1, 2, 3)]
    [failed] = out.quarantined
    assert failed.what == "row orders:2" and isinstance(failed.error, ArithmeticError)
    assert sorted(failed.held) == [
        ("entity_inputs", ("orders:2", "a22" * 32)),
        ("entity_inputs", ("orders:2", "b22" * 32)),
    ]
    assert events.keys == set()  # every input released: the failed row's too
    assert "orders:2" not in d._entities and len(d._inputs) == 0
    d.on_access(acc("c" * 2, DbOperation.READ, 20_000, entity="orders:2"))
    assert len(d._entities.get("orders:2").accesses) == 1  # type: ignore[union-attr]


def test_traces_held_for_late_changes_are_not_walked_again_while_nothing_can_go() -> None:
    """Traces on rows waiting for their late changes are kept until Debezium's lag bound; a watermark moving on
    meanwhile (an idle daemon's event time follows the clock), and more statements of those traces, do not walk
    them again each time, yet they go once their holds lapse, and a new trace is forgotten in its turn."""
    d = detector(late_ns=30_000 * MS)
    d.on_commit("orders:0", Commit(change(1, {"status": "x"}, {"status": "y"}, -9_000)))  # orders is captured
    for i in range(1, 41):
        d.on_access(acc(f"{i:02x}", DbOperation.WRITE, i, entity=f"orders:{i}", set_values=(("status", "paid"),)))
    assert d.close_until(T0 + 3_000 * MS) == [] and d.telemetry.state["held_traces"] == 40
    walked: list[str] = []

    class Walked(CountedLRU[str, list[Access]]):
        __slots__ = ()

        def get(self, key: str, default: list[Access] | None = None) -> list[Access] | None:
            walked.append(key)
            return super().get(key, default)

    d._by_trace.__class__ = Walked
    for step in range(1, 50):
        assert d.close_until(T0 + (3_000 + 100 * step) * MS) == []
        d.on_access(acc(f"{step % 40 + 1:02x}", DbOperation.READ, 1, entity=f"orders:{step % 40 + 1}"))
    assert len(walked) == d.counters["accesses"] - 40 > 0  # the reads' own lookups only: no walk
    assert d.telemetry.state["traces"] == 40
    d.on_access(acc("ff", DbOperation.READ, 8_000, entity="orders:999"))  # not held: goes when it is old
    assert d.close_until(T0 + 12_000 * MS) == [] and d.telemetry.state["traces"] == 40
    assert d.close_until(T0 + 40_000 * MS) == [] and d.telemetry.state["traces"] == 0


def test_rows_of_a_revoked_partition_go_with_it() -> None:
    """The rows an internal partition fed, and the input they held, go when that partition moves to another
    instance: the new owner replays and judges them. Judged here as well, the pair would be reported twice (two
    instances, one watermark). The other partitions' rows are judged as before."""
    d = detector()
    for entity, part in (("orders:1", "accesses/0"), ("orders:2", "accesses/1")):
        for a in [
            acc("a", DbOperation.READ, 0, entity=entity),
            acc("b", DbOperation.READ, 2, entity=entity),
            acc("a", DbOperation.WRITE, 5, entity=entity, set_values=(("status", "cancelled"),)),
            acc("b", DbOperation.WRITE, 9, entity=entity, set_values=(("status", "paid"),)),
        ]:
            d.on_access(a, part)
    held = len(d._inputs)
    d.on_revoke("accesses/2")  # a partition that fed nothing here
    assert len(d) == 2 and len(d._inputs) == held
    d.on_revoke("accesses/0")
    assert len(d) == 1 and 0 < len(d._inputs) < held and d.counters["revoked_rows"] == 1
    assert [c.entity for c in d.close_until(T0 + 10_000 * MS)] == ["orders:2"]
