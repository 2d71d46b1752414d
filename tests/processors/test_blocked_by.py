"""The blocked-by detector over hand-built row histories: planted lock waits found and named, controls silent."""

from __future__ import annotations

from dataclasses import replace

from processors.api.component import Emit
from processors.detectors.blocked_by import BLOCKED_BY, BlockedByData, BlockedByDetector
from processors.model.events import Access, CdcOp, Commit, DbOperation, LockMode, RowChange
from processors.model.finding import FindingEvent, data_of

MS = 1_000_000
T0 = 1_800_000_000_000 * MS  # an event time in 2027, on a window boundary
SHIP = "shop.handlers.ship_order"
DISCOUNT = "shop.handlers.apply_discount"


def acc(trace: str, at_ms: float, dur_ms: float, *, row: int = 1, op: DbOperation = DbOperation.WRITE,
        lock: LockMode = LockMode.NONE, function: str = DISCOUNT, version: str = "1.0.0") -> Access:  # fmt: skip
    start = T0 + int(at_ms * MS)
    return Access(
        entity=f"orders:{row}", table="orders", operation=op, lock=lock, trace_id=trace.ljust(32, "0"),
        span_id=f"{trace}{int(at_ms * 1000):012d}", service="shop", version=version, start_ns=start,
        end_ns=start + int(dur_ms * MS), statement="UPDATE orders SET amount = %s WHERE id = %s", function=function,
        route="/orders/{order_id}/ship" if function == SHIP else "/orders/{order_id}/discount",
    )  # fmt: skip


def commit_of(by: Access, at_ms: float, lsn: int, *, credited: bool = True) -> tuple[str, Commit]:
    key = (("id", int(by.entity.split(":")[1])),)
    row = RowChange(table="public.orders", op=CdcOp.UPDATE, key=key, before={}, after={},
                    commit_ts_ms=T0 // MS + int(at_ms), ts_ms=0, lsn=lsn, tx_id=str(lsn))  # fmt: skip
    return by.entity, Commit(row, by.trace_id, by.span_id, "values_time") if credited else Commit(row)


def detector(**kw: object) -> BlockedByDetector:
    args: dict[str, object] = dict(min_wait_ns=100 * MS, release_ns=50 * MS, skew_ns=5 * MS, window_ns=60_000 * MS,
                                   settle_ns=0, max_hold_ns=30_000 * MS, min_blocked=2)  # fmt: skip
    return BlockedByDetector(**{**args, **kw})  # type: ignore[arg-type]


def holder_round(d: BlockedByDetector, n: int, *, at_ms: float, hold_ms: float = 300.0, row: int | None = None,
                 version: str = "1.0.0", wait: bool = True, part: str = "") -> None:  # fmt: skip
    """Trace ``h<n>`` locks the row FOR UPDATE, works ``hold_ms`` outside the database, updates it and commits;
    trace ``w<n>``'s UPDATE of the row starts 5 ms in and returns 1 ms after that commit."""
    row = n if row is None else row
    lock = acc(f"h{n}", at_ms, 1, row=row, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP,
               version=version)  # fmt: skip
    write = acc(f"h{n}", at_ms + hold_ms, 1, row=row, function=SHIP, version=version)
    committed = at_ms + hold_ms + 2
    waiter = acc(f"w{n}", at_ms + 5, (committed + 1 - (at_ms + 5)) if wait else 2, row=row, version=version)
    for a in (lock, write, waiter):
        d.on_access(a, part)
    d.on_commit(*commit_of(write, committed, 10 * n), part)
    d.on_commit(*commit_of(waiter, committed + 2, 10 * n + 1), part)


def close(d: BlockedByDetector, at_ms: float = 120_000) -> list[FindingEvent]:
    out = Emit()
    d.on_watermark(T0 + int(at_ms * MS), None, out)
    assert not out.quarantined
    return [e for e in out.events if isinstance(e, FindingEvent)]


def test_a_statement_waiting_on_a_lock_held_across_slow_work_is_found_with_both_paths() -> None:
    """Three requests each wait ~300 ms on a row that ship_order locked before a slow external call."""
    d = detector()
    for n in (1, 2, 3):
        holder_round(d, n, at_ms=1000 * n)
    (found,) = close(d)
    data = data_of(found, BlockedByData)
    assert found.type == BLOCKED_BY.name and found.remedy == "shorten_lock_hold"
    assert (data.blocked_path, data.blocking_path, data.table, data.blocked, data.rows) == (DISCOUNT, SHIP, "orders",
                                                                                            3, 3)  # fmt: skip
    assert data.max_wait_ms == 297 and data.total_wait_ms == 3 * 297  # from the waiter's start to the commit
    assert data.median_hold_ms == 302  # from the FOR UPDATE to the commit
    assert data.holder_outside_db_share > 0.9
    assert data.blocked_routes == ["/orders/{order_id}/discount"] and data.blocking_routes == [
        "/orders/{order_id}/ship"
    ]
    assert found.contract is not None and found.contract.signature == f"finding:blocked_by:{found.fingerprint}"
    assert found.contract.routes == ["/orders/{order_id}/discount"] and found.contract.service == "shop"
    assert [len(s.points) for s in found.series] == [3, 3]
    assert found.traces == [f"w{n}".ljust(32, "0") for n in (1, 2, 3)]
    assert any("waited on a row lock of orders held by " + SHIP in line for line in found.evidence)


def test_the_fingerprint_is_stable_across_builds_and_windows() -> None:
    """The same pair on another build, in another window, is the same finding (another occurrence)."""
    d = detector()
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    for n in (3, 4):
        holder_round(d, n, at_ms=61_000 + 1000 * n, version="1.1.0")
    first, second = close(d, 200_000)
    assert first.fingerprint == second.fingerprint and first.occurrence != second.occurrence
    assert (first.subject.version, second.subject.version) == ("1.0.0", "1.1.0")


def test_a_lock_held_briefly_stays_silent() -> None:
    """The fixed build: the slow work before the transaction, the waiter's UPDATE waits a few ms only."""
    d = detector()
    for n in (1, 2, 3):
        holder_round(d, n, at_ms=1000 * n, hold_ms=4)
    assert close(d) == [] and d.counters.get("blocks", 0) == 0


def test_a_slow_statement_on_another_row_stays_silent() -> None:
    """Two writers on different rows: a slow UPDATE that ends as another row's holder commits was not blocked."""
    d = detector()
    for n in (1, 2, 3):
        holder_round(d, n, at_ms=1000 * n, wait=False)  # the waiter on the row is quick
        slow = acc(f"x{n}", 1000 * n + 5, 298, row=100 + n)  # a slow statement of another row, ending at the commit
        d.on_access(slow)
        d.on_commit(*commit_of(slow, 1000 * n + 304, 900 + n))
    assert close(d) == [] and d.counters["long_statements"] == 3 and d.counters.get("blocks", 0) == 0


def test_a_slow_statement_not_released_by_the_commit_stays_silent() -> None:
    """Slow for its own reasons: it started after the holder committed, or returned long after the commit."""
    d = detector()
    for n in (1, 2, 3):
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
        after = acc(f"a{n}", 1000 * n + 310, 200, row=n)  # started after the commit at +302
        late = acc(f"l{n}", 1000 * n + 5, 500, row=n)  # returned 200 ms after it
        for a in (lock, write, after, late):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n))
    assert close(d) == [] and d.counters.get("blocks", 0) == 0


def test_a_commit_credited_to_no_trace_names_no_holder() -> None:
    """Never guessed: without correlation's credit the holder is unknown."""
    d = detector()
    for n in (1, 2, 3):
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
        waiter = acc(f"w{n}", 1000 * n + 5, 298, row=n)
        for a in (lock, write, waiter):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n, credited=False))
    assert close(d) == [] and d.counters["uncredited_commits"] == 3


def test_share_locks_do_not_block_each_other() -> None:
    """A FOR SHARE read does not wait on another trace's FOR SHARE read."""
    d = detector()
    for n in (1, 2, 3):
        share = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_SHARE, function=SHIP)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
        reader = acc(f"w{n}", 1000 * n + 5, 298, row=n, op=DbOperation.READ, lock=LockMode.FOR_SHARE)
        for a in (share, write, reader):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n))
    assert close(d) == []  # the holder's UPDATE started after the reader: it held no conflicting lock before


def test_the_database_clock_within_the_skew_is_tolerated_beyond_it_not() -> None:
    """A commit time 4 ms ahead of the application's clock (skew 5 ms) still releases the waiter; 60 ms does not."""
    for ahead_ms, found in ((4, 1), (60, 0)):
        d = detector()
        for n in (1, 2):
            lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
            write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
            waiter = acc(f"w{n}", 1000 * n + 5, 298, row=n)
            for a in (lock, write, waiter):
                d.on_access(a)
            d.on_commit(*commit_of(write, 1000 * n + 302 + ahead_ms, 10 * n))
        assert len(close(d)) == found, ahead_ms


def test_a_late_commit_is_judged_when_it_comes() -> None:
    """Debezium behind the settle time: the statements the commit released are judged again when it arrives."""
    d = detector()
    commits = []
    for n in (1, 2):
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
        for a in (lock, write, acc(f"w{n}", 1000 * n + 5, 298, row=n)):
            d.on_access(a)
        commits.append(commit_of(write, 1000 * n + 302, 10 * n))
    assert close(d, 10_000) == []  # judged without the commits: nothing
    for entity, c in commits:
        d.on_commit(entity, c)
    (found,) = close(d)
    assert data_of(found, BlockedByData).blocked == 2 and d.counters["late_commits"] == 2


def test_a_replay_counts_nothing_twice() -> None:
    """Input delivered again (a restart's replay before the window closed) adds no lock wait."""
    d = detector()
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    (found,) = close(d)
    assert data_of(found, BlockedByData).blocked == 2 and d.counters["redelivered"] > 0


def test_one_wait_in_a_window_is_below_the_floor_of_a_finding() -> None:
    """``min_blocked``: a single wait of a pair in a window is counted, not reported."""
    d = detector()
    holder_round(d, 1, at_ms=1000)
    assert close(d) == [] and d.counters["below_min_blocked"] == 1


def test_paths_waiting_on_each_other_point_at_the_lock_order() -> None:
    """ship_order waits on apply_discount and apply_discount on ship_order in one window: lock_order."""
    d = detector()
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    for n in (3, 4):  # the roles swapped: apply_discount holds, ship_order waits
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n)
        waiter = replace(acc(f"w{n}", 1000 * n + 5, 298, row=n, function=SHIP), route="/orders/{order_id}/ship")
        for a in (lock, write, waiter):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n))
    found = close(d)
    assert len(found) == 2 and {f.remedy for f in found} == {"lock_order"}
    assert all(data_of(f, BlockedByData).both_ways for f in found)


def test_state_is_released_and_pruned_after_the_windows_close() -> None:
    """Rows and traces go once their windows are emitted and their history is older than the longest hold."""
    d = detector(max_hold_ns=1000 * MS)
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    assert len(close(d, 120_000)) == 1
    close(d, 300_000)
    assert len(d._rows) == 0 and len(d._times) == 0


class Pins:
    """The keys whose input is held (what the runtime turns into offset pins)."""

    def __init__(self) -> None:
        self.held: set[object] = set()

    def retained(self, store: str, key: object) -> None:
        self.held.add(key)

    def released(self, store: str, key: object) -> None:
        self.held.discard(key)


def test_input_is_released_once_judged_and_a_lock_wait_holds_it_until_its_window_is_out() -> None:
    """A row with no lock wait lets its input go as soon as its statements are judged; a row with one keeps it until
    the window that counts the wait is emitted, so that a restart replays it."""
    pins = Pins()
    d = detector(events=pins)
    holder_round(d, 1, at_ms=1000)  # orders:1: a lock wait
    holder_round(d, 2, at_ms=2000, hold_ms=4)  # orders:2: a brief hold, nothing to count
    assert rows_held(pins) == {"orders:1", "orders:2"}
    assert close(d, 10_000) == []  # judged, the window (60 s) still open
    assert rows_held(pins) == {"orders:1"}
    close(d, 60_000)
    assert pins.held == set()


def rows_held(pins: Pins) -> set[str]:
    """The rows whose input is held (by their slots: a row and a second of event time)."""
    return {str(key[0]) if isinstance(key, tuple) else str(key) for key in pins.held}


def test_a_row_written_without_rest_lets_its_input_go_as_it_is_judged() -> None:
    """A row written every 200 ms for a minute (a serial writer: no lock wait) does not hold its whole history: the
    input of its first seconds is released while it is still being written, a few seconds behind event time."""
    pins = Pins()
    d = detector(events=pins)
    early: set[object] = set()
    for i in range(300):
        at = 1000 + i * 200
        d.on_access(acc(f"s{i}", at, 2, row=7))
        close(d, at)
        if i == 5:
            early = set(pins.held)
        assert len(pins.held) <= 3, (i, pins.held)
    assert early and not early & pins.held


def test_long_statements_waiting_to_be_judged_are_bounded() -> None:
    """Past ``max_entities`` long statements not judged yet, more are counted as dropped, not kept."""
    d = detector(max_entities=2)
    for n in (1, 2, 3):
        d.on_access(acc(f"w{n}", 1000 * n, 300, row=n))
    assert len(d._due) == 2 and d.telemetry.dropped["max_due"] == 1


def test_a_hold_spent_in_the_holders_own_statements_points_at_them() -> None:
    """The holder locks the row and then runs a slow statement itself: the remedy is its statements, not the hold."""
    d = detector()
    for n in (1, 2):
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
        slow = replace(acc(f"h{n}", 1000 * n + 2, 296, row=500 + n, function=SHIP), entity=f"orders:{500 + n}")
        write = acc(f"h{n}", 1000 * n + 299, 1, row=n, function=SHIP)
        waiter = acc(f"w{n}", 1000 * n + 5, 298, row=n)
        for a in (lock, slow, write, waiter):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n))
    (found,) = close(d)
    assert found.remedy == "speed_up_holder_statements"
    assert data_of(found, BlockedByData).holder_outside_db_share < 0.1


def test_a_row_inferred_among_several_candidates_names_no_lock_wait() -> None:
    """Only statements on one known row take part: a key inferred among candidates is not a row lock we know of."""
    d = detector()
    for n in (1, 2):
        lock = acc(f"h{n}", 1000 * n, 1, row=n, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
        write = acc(f"h{n}", 1000 * n + 300, 1, row=n, function=SHIP)
        waiter = replace(acc(f"w{n}", 1000 * n + 5, 298, row=n), keying="by_change", key_candidates=2)
        for a in (lock, write, waiter):
            d.on_access(a)
        d.on_commit(*commit_of(write, 1000 * n + 302, 10 * n))
    assert close(d) == [] and d.counters.get("long_statements", 0) == 0


def test_a_lock_wait_found_after_its_window_was_emitted_is_counted_not_published_again() -> None:
    """A row change so late that its window is out (the row's history still there): the wait is counted
    (``late_blocks``), no second occurrence."""
    d = detector(max_hold_ns=200_000 * MS)
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n)
    lock = acc("h3", 3000, 1, row=3, op=DbOperation.READ, lock=LockMode.FOR_UPDATE, function=SHIP)
    write = acc("h3", 3300, 1, row=3, function=SHIP)
    for a in (lock, write, acc("w3", 3005, 298, row=3)):
        d.on_access(a)
    assert len(close(d)) == 1  # the window of rounds 1 and 2 (round 3's commit had not come)
    d.on_commit(*commit_of(write, 3302, 30))
    assert close(d, 200_000) == [] and d.counters["late_blocks"] == 1


def test_rows_of_a_revoked_partition_go_with_their_lock_waits() -> None:
    """Input partition p0 goes to another instance: the rows it fed go from here with their lock waits already
    counted in the open window, their statements not judged yet and their input; p1's rows stay and are reported."""
    pins = Pins()
    d = detector(events=pins)
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n, part="p0")
    for n in (3, 4):
        holder_round(d, n, at_ms=1000 * n, part="p1")
    assert close(d, 10_000) == []  # four lock waits judged, their window (60 s) open
    holder_round(d, 5, at_ms=20_000, part="p0")  # not judged yet
    d.on_revoke("p0")
    assert rows_held(pins) == {"orders:3", "orders:4"}
    assert d.telemetry.events["revoked_rows"] == 3
    (found,) = close(d)
    data = data_of(found, BlockedByData)
    assert (data.blocked, data.rows, data.total_wait_ms) == (2, 2, 2 * 297)
    assert found.traces == [f"w{n}".ljust(32, "0") for n in (3, 4)]


def test_a_window_left_with_nothing_after_a_revoke_is_not_reported() -> None:
    d = detector()
    for n in (1, 2):
        holder_round(d, n, at_ms=1000 * n, part="p0")
    close(d, 10_000)
    d.on_revoke("p0")
    d.on_revoke("p1")  # a partition that fed nothing here changes nothing
    assert close(d) == [] and not d._windows
