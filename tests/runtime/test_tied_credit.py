"""Stage 2 crediting of a row's changes tied between value-less writers (stock instrumentation: no statement
parameters on the spans), when the row's changes come due in different batches.

Two traces each read then write one row; the second UPDATE waits for the first one's row lock, so it ends right after
the first commit. Each change ties between both writers on values and time; only commit order, asked for both changes
with both writers together, decides. The first change coming due before the second (a batch boundary, or Debezium
delivering the second in a later poll) must not be settled uncorrelated while the second can still come.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from processors.model.events import Access, CdcOp, DbCall, Resource, RowChange, SpanKind, StatusCode
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from tests.runtime.test_stage2 import MS, T0, Pipe

EXTRACTOR = SqlAccessExtractor(key_columns={"accounts": ["id"]})
READ = "SELECT balance FROM accounts WHERE id = %s"
WRITE = "UPDATE accounts SET balance = %s WHERE id = %s"
A, B = "a" * 32, "b" * 32


def access(statement: str, trace: str, span: str, start_ms: int, end_ms: int, request_end_ms: int) -> Access:
    """The access stage 1 derives from a DB span without parameters (times in ms after T0)."""
    s = Span(trace_id=trace, span_id=span, parent_id=f"{trace[:15]}0", name="db", kind=SpanKind.CLIENT,
             start_ns=T0 + start_ms * MS, end_ns=T0 + end_ms * MS, status=StatusCode.UNSET,
             resource=Resource(service="bank"), db=DbCall(system="postgresql", statement=statement))  # fmt: skip
    [a] = EXTRACTOR.accesses(s)
    assert a.entity == "accounts:*" and a.unbound_key  # a predicate access of the table: its key is not known
    return replace(a, request_start_ns=T0 + (start_ms - 1) * MS, request_end_ns=T0 + request_end_ms * MS)


def change(before: int, after: int, commit_ms: int, lsn: int) -> RowChange:
    commit = (T0 + commit_ms * MS) // MS
    row = "acc-201-bug"
    return RowChange("public.accounts", CdcOp.UPDATE, (("id", row),), {"id": row, "balance": before},
                     {"id": row, "balance": after}, commit, commit + 5, lsn, str(lsn))  # fmt: skip


def lost_update() -> tuple[list[Access], RowChange, RowChange]:
    """A reads and writes (commit at 1012 ms); B reads, its UPDATE blocks on A's lock until A commits (ends 1013),
    commits at 1014. Both changes tie between A and B on values and time."""
    accesses = [
        access(READ, A, "a-read", 1000, 1001, 1014),
        access(WRITE, A, "a-write", 1010, 1011, 1014),
        access(READ, B, "b-read", 1002, 1003, 1016),
        access(WRITE, B, "b-write", 1004, 1013, 1016),
    ]
    return accesses, change(100, 110, 1012, 10), change(100, 120, 1014, 11)


def credits(outs: list[Any]) -> dict[int, tuple[str | None, str]]:
    return {r["lsn"]: (r["span"], r["strength"]) for out in outs for r in out.graph.changes}


def lost_updates(outs: list[Any]) -> list[dict[str, Any]]:
    events = [e.model_dump(mode="json") for out in outs for e in out.events]
    return [e for e in events if e.get("kind") == "incident" and e.get("anomaly") == "lost_update"]


def test_a_tied_change_due_before_its_rows_next_change_waits_for_it_and_commit_order_decides() -> None:
    """The first change comes due alone (the second arrives in a later batch): it waits (pinned, holding event time)
    for the second, then both are credited in commit order and the lost update is found."""
    p = Pipe()
    accesses, one, two = lost_update()
    outs = [p.send(*accesses, one), p.upstream(3.0175)]  # 1012 ms + 2.005 s passed; 1014 ms + 2.005 s not yet
    assert credits(outs) == {}  # waits: two writers tied over one change so far, and B may still have committed one
    assert p.pending() == 1 and p.committable() <= 4  # still pinned (offset 4)
    outs += [p.send(two), p.upstream(10)]
    assert credits(outs) == {10: ("a-write", "commit_order"), 11: ("b-write", "commit_order")}
    assert p.metric("trace_repro_row_changes_correlated_total", strength="none") == 0
    counters = p.stage.correlator.counters
    assert (counters["tie_waits"], counters["tie_wait_resolved"], counters.get("tie_wait_expired", 0)) == (1, 1, 0)
    [incident] = lost_updates(outs)
    assert incident["entity"] == "accounts:acc-201-bug", incident
    for out in [*outs, p.drain()]:
        p.stage.release(out.release)
    assert p.pending() == 0 and p.committable() == p.positions[("trace-repro.accesses", 0)]


def test_a_change_already_there_but_not_due_is_waited_for_too() -> None:
    """Both changes arrived; event time stops between their due times at a batch end."""
    p = Pipe()
    accesses, one, two = lost_update()
    outs = [p.send(*accesses, one, two), p.upstream(3.0175), p.upstream(3.0195)]
    assert credits(outs) == {10: ("a-write", "commit_order"), 11: ("b-write", "commit_order")}
    outs.append(p.upstream(10))
    assert len(lost_updates(outs)) == 1


def test_a_tie_no_later_change_settles_is_written_uncorrelated_once_its_writers_could_have_committed() -> None:
    """One change, two writers: it waits only until event time has passed the latest commit any of its writers could
    have made, plus the credit delay; then it is written uncorrelated (never guessed) and the expiry is counted."""
    p = Pipe()
    accesses, one, _ = lost_update()
    outs = [p.send(*accesses, one), p.upstream(3.0175), p.upstream(3.0255)]
    assert credits(outs) == {}
    outs.append(p.upstream(3.0265))  # B's request end 1016 ms + skew 5 ms + 2.005 s
    assert credits(outs) == {10: (None, "none")}
    assert (p.stage.correlator.counters["tie_waits"], p.stage.correlator.counters["tie_wait_expired"]) == (1, 1)
    assert p.pending() == 0


def test_the_wait_is_bounded_by_max_tie_wait_and_zero_turns_it_off() -> None:
    """``correlation.max_tie_wait_ms`` caps the wait after the change first came due (writers whose requests end far
    ahead must not hold event time that long); 0 settles at once, as without waiting."""
    for wait_ms, settled_at in (("3", 3.0206), ("0", 3.0175)):
        p = Pipe(TRACE_REPRO_CORRELATION__MAX_TIE_WAIT_MS=wait_ms)
        accesses, one, _ = lost_update()
        p.send(*accesses, one)
        outs = [p.upstream(3.0175), p.upstream(3.0195)]
        outs.append(p.upstream(settled_at))
        assert credits(outs) == {10: (None, "none")}, wait_ms
        assert p.pending() == 0


def test_a_waiting_group_whose_crediting_raises_is_quarantined_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's next change comes and crediting the row raises: its changes are written uncorrelated (never guessed)
    and quarantined, its pins released; another row credited in the same batch is credited."""
    p = Pipe()
    accesses, one, two = lost_update()
    other = replace(change(5, 6, 1014, 20), key=(("id", "acc-7"),), before={"id": "acc-7", "balance": 5},
                    after={"id": "acc-7", "balance": 6})  # fmt: skip
    writer = access(WRITE, "c" * 32, "c-write", 1020, 1021, 1022)
    p.send(*accesses, writer, one)
    p.upstream(3.0175)
    real = p.stage.correlator.correlate_many

    def correlate_many(changes: Any) -> Any:
        if len([c for c in changes if c.entity_key == one.entity_key]) == 2:
            raise ValueError("injected")
        return real(changes)

    monkeypatch.setattr(p.stage.correlator, "correlate_many", correlate_many)
    outs = [p.send(replace(other, commit_ts_ms=(T0 + 1022 * MS) // MS), two), p.upstream(10)]
    assert credits(outs) == {10: (None, "none"), 11: (None, "none"), 20: ("c-write", "values_time")}
    assert p.metrics.telemetry("correlation").dropped["quarantined"] == 1
    assert p.pending() == 0


def test_two_rows_tied_across_their_writers_are_credited_by_the_one_assignment_one_clock_allows() -> None:
    """Two rounds of the same race on two rows, 6 ms apart (the sample shop's timings, parameters off): the second
    round's writers end within the skew tolerance of the first round's commits, so each change ties among all four
    writers, and per row commit order cannot decide. One clock offset for the service allows one assignment only
    (``processors.correlation.clock_match``): every change is credited to its writer and both lost updates are found."""
    p = Pipe()

    def at(ms: float) -> int:
        return T0 + int(ms * MS)

    def timed(statement: str, trace: str, span: str, start: float, end: float, request_end: float) -> Access:
        a = access(statement, trace, span, 0, 1, 2)
        return replace(a, start_ns=at(start), end_ns=at(end), request_start_ns=at(start - 1),
                       request_end_ns=at(request_end))  # fmt: skip

    def row_change(row: str, before: int, after: int, commit_ms: int, lsn: int) -> RowChange:
        return replace(change(before, after, commit_ms, lsn), key=(("id", row),), before={"id": row, "balance": before},
                       after={"id": row, "balance": after})  # fmt: skip

    c, d, e, f = "c" * 32, "d" * 32, "e" * 32, "f" * 32
    accesses = [  # row x: C then D (D's UPDATE waits for C's lock); row y, 6 ms later: E then F
        timed(READ, c, "c-read", 1007.7, 1008.3, 1009.0),
        timed(WRITE, c, "c-write", 1008.4, 1008.7, 1009.0),
        timed(READ, d, "d-read", 1006.0, 1006.5, 1010.2),
        timed(WRITE, d, "d-write", 1008.5, 1009.8, 1010.2),
        timed(READ, e, "e-read", 1014.0, 1014.5, 1015.3),
        timed(WRITE, e, "e-write", 1014.6, 1014.96, 1015.3),
        timed(READ, f, "f-read", 1013.4, 1013.9, 1015.9),
        timed(WRITE, f, "f-write", 1014.7, 1015.5, 1015.9),
    ]
    changes = [row_change("x", 100, 110, 1009, 10), row_change("x", 110, 120, 1010, 11),
               row_change("y", 100, 110, 1015, 12), row_change("y", 110, 120, 1015, 13)]  # fmt: skip
    outs = [p.send(*accesses, *changes), p.upstream(3.0175), p.upstream(3.03), p.upstream(10)]
    assert credits(outs) == {10: ("c-write", "commit_order"), 11: ("d-write", "commit_order"),
                             12: ("e-write", "commit_order"), 13: ("f-write", "commit_order")}  # fmt: skip
    assert sorted(i["entity"] for i in lost_updates(outs)) == ["accounts:x", "accounts:y"]


def test_tied_rows_that_more_than_one_assignment_fits_stay_tied() -> None:
    """The same two rows with both rounds' writers interleaved in time: several assignments fit one clock offset,
    so no change is credited to a writer (never guessed)."""
    p = Pipe()
    c, d, e, f = "c" * 32, "d" * 32, "e" * 32, "f" * 32
    accesses = [access(WRITE, t, f"{t[0]}-write", 1008, 1009, 1011) for t in (c, d, e, f)]
    changes = [replace(change(100, 110 + i, 1009 + i // 2, 10 + i), key=(("id", row),),
                       before={"id": row, "balance": 100}, after={"id": row, "balance": 110 + i})
               for i, row in enumerate(("x", "x", "y", "y"))]  # fmt: skip
    outs = [p.send(*accesses, *changes), p.upstream(10)]
    assert {strength for _, strength in credits(outs).values()} <= {"none", "tied"}


def test_a_tie_another_rows_change_settles_in_the_same_batch_is_credited_again_before_it_is_settled() -> None:
    """Write skew on the Java service under load (a miss seen under CPU burners): A writes row x and commits at the end
    of its request; B's UPDATE of row y starts within the skew tolerance of that commit, so x's change ties between A
    and B. y's change, 8 ms later, only B can have made. Event time jumps past both due times in one batch: x's row is
    credited first (tied), then y's (B). B has made another row's change and its statement writes one row, so x's
    change must be credited again then (A), not settled uncorrelated because its writers' wait is already over."""
    p = Pipe()
    accesses = [
        access(READ, A, "a-read", 1006, 1007, 1014),
        access(WRITE, A, "a-write", 1009, 1010, 1014),
        access(READ, B, "b-read", 999, 1000, 1023),
        access(WRITE, B, "b-write", 1013, 1015, 1023),
    ]
    x = replace(change(100, 0, 1013, 10), key=(("id", "x"),), before={"id": "x", "balance": 100},
                after={"id": "x", "balance": 0})  # fmt: skip
    y = replace(change(100, 0, 1021, 11), key=(("id", "y"),), before={"id": "y", "balance": 100},
                after={"id": "y", "balance": 0})  # fmt: skip
    outs = [p.send(*accesses, x, y), p.upstream(10)]
    assert credits(outs) == {10: ("a-write", "values_time"), 11: ("b-write", "values_time")}
    assert p.metric("trace_repro_row_changes_correlated_total", strength="none") == 0
    assert p.pending() == 0
