"""Write skew (Adya G2-item): two doctors each check that someone else is on call, then both go off call.

``go_off_call(name, shift)`` counts the doctors on call in the shift (``SELECT count(*) ... WHERE shift = %s AND
on_call``); with two or more it takes its own doctor off call (``UPDATE ... SET on_call = false WHERE name = %s``).
Two doctors of one shift race at READ COMMITTED: both count two, the leader takes Alice off call and commits, then
the follower takes Bob off call and commits. Nobody is on call any more, though each request checked the invariant
("at least one on call") on a consistent view. Neither request overwrote the other: they wrote different rows.

In Adya's terms each transaction read an item the other one then wrote (the leader read Bob's row, which the
follower replaced: leader --rw--> follower; the follower read Alice's row, which the leader replaced: follower
--rw--> leader): a cycle of two anti-dependency edges over two objects, G2-item, which snapshot isolation allows and
only serializability forbids. Debezium shows two updates of two different rows; the damage is in the predicate
(``count(*) ... on_call``), not in any one row.

Culprit: the request that committed first; victim: the other one (its check was invalidated before it committed).

Controls (no anomaly; neither commits both updates):

- ``go_off_call_locked``: ``SELECT name ... WHERE shift = %s AND on_call FOR UPDATE``, counted in Python. The
  follower's locking read waits for the leader's commit, re-evaluates the predicate on the new row versions, sees
  one doctor on call and refuses (409).
- ``go_off_call_serializable``: the buggy statements at SERIALIZABLE, retried once on a serialization failure. The
  follower fails with a serialization failure (the psycopg span of the failing statement records it); its retry
  counts one doctor on call and refuses (409).

Table ``corpus_doctors(name text PRIMARY KEY, shift int, on_call bool)``: keyed by ``name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg
from psycopg import IsolationLevel
from psycopg.errors import SerializationFailure

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import BUG, Contender, Evidence, Expectation, RoundPlan, Scenario, Table, expect
from bench.corpus.service import Outcome, Refused

DOCTORS = Table(
    "corpus_doctors",
    "CREATE TABLE corpus_doctors (name text PRIMARY KEY, shift int NOT NULL, on_call bool NOT NULL)",
    ("name",),
)
COUNT = "SELECT count(*) FROM corpus_doctors WHERE shift = %s AND on_call"
LOCK = "SELECT name FROM corpus_doctors WHERE shift = %s AND on_call FOR UPDATE"
OFF = "UPDATE corpus_doctors SET on_call = false WHERE name = %s"
ROUTE = "/doctors/{name}/off-call"


class LastOnCall(Refused):
    """Going off call would leave the shift with nobody on call."""


def _on_call(row: Any) -> int:
    return int(row[0]) if row is not None else 0


def go_off_call(conn: psycopg.Connection, name: str, shift: int) -> dict[str, Any]:
    """Buggy: the check (a count) is not protected against a concurrent change of another row."""
    with conn.transaction(), conn.cursor() as cur:
        on_call = _on_call(cur.execute(COUNT, (shift,)).fetchone())
        if on_call < 2:
            raise LastOnCall(f"{name} is the last doctor on call in shift {shift}")
        race_point()
        cur.execute(OFF, (name,))
        race_point("written")
    race_point("committed")
    return {"name": name, "shift": shift, "on_call_before": on_call}


def go_off_call_locked(conn: psycopg.Connection, name: str, shift: int) -> dict[str, Any]:
    """Control: the doctors on call are read with ``FOR UPDATE``; a concurrent request waits and re-checks."""
    with conn.transaction(), conn.cursor() as cur:
        race_point()
        names = [r[0] for r in cur.execute(LOCK, (shift,)).fetchall()]
        if len(names) < 2 or name not in names:
            raise LastOnCall(f"{name} cannot go off call: on call in shift {shift}: {names}")
        cur.execute(OFF, (name,))
        race_point("written")
    race_point("committed")
    return {"name": name, "shift": shift, "on_call_before": len(names)}


def go_off_call_serializable(conn: psycopg.Connection, name: str, shift: int) -> dict[str, Any]:
    """Control: the buggy transaction at SERIALIZABLE, retried once after a serialization failure."""
    conn.isolation_level = IsolationLevel.SERIALIZABLE
    for attempt in (1, 2):
        try:
            with conn.transaction(), conn.cursor() as cur:
                on_call = _on_call(cur.execute(COUNT, (shift,)).fetchone())
                if on_call < 2:
                    raise LastOnCall(f"{name} is the last doctor on call in shift {shift} (attempt {attempt})")
                race_point()
                cur.execute(OFF, (name,))
                race_point("written")
        except SerializationFailure:
            if attempt == 2:
                raise
            continue
        race_point("committed")
        return {"name": name, "shift": shift, "on_call_before": on_call, "attempts": attempt}
    raise AssertionError("unreachable")


class WriteSkew(Scenario):
    name: ClassVar[str] = "write_skew"
    tables: ClassVar[tuple[Table, ...]] = (DOCTORS,)
    kinds: ClassVar[tuple[str, ...]] = (BUG, "control:for_update", "control:serializable_retry")
    handlers: ClassVar[dict[str, Any]] = {BUG: go_off_call, "control:for_update": go_off_call_locked,
                                          "control:serializable_retry": go_off_call_serializable}  # fmt: skip

    @staticmethod
    def doctors(number: int) -> tuple[str, str]:
        return f"alice-{number}", f"bob-{number}"

    def plan(self, kind: str, number: int) -> RoundPlan:
        shift = number  # one shift per round: the rounds' predicates never overlap
        names = self.doctors(number)
        leader, follower = (Contender(self.handlers[kind], ROUTE, f"/doctors/{n}/off-call", (n, shift),
                                      (DOCTORS.entity(n),)) for n in names)  # fmt: skip
        rows = tuple(DOCTORS.entity(n) for n in names)
        if kind == BUG:  # both counted two; the follower writes only once the leader committed
            return RoundPlan(kind, number, rows, leader, follower, Choreography("committed"), (200, 200),
                             Expectation("write_skew", "leader", "follower"))  # fmt: skip
        if kind == "control:for_update":  # the follower's locking read waits for the leader's commit
            return RoundPlan(kind, number, rows, leader, follower, Choreography("written", hold_s=0.05), (200, 409))
        return RoundPlan(kind, number, rows, leader, follower, Choreography("committed"), (200, 409))

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO corpus_doctors (name, shift, on_call) VALUES (%s, %s, true)",
                            [c.args for p in plans for c in (p.leader, p.follower)])  # fmt: skip

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        shift = plan.leader.args[1]
        row = conn.execute("SELECT count(*) FROM corpus_doctors WHERE shift = %s AND on_call", (shift,)).fetchone()
        on_call = int(row[0]) if row else -1
        want = 0 if plan.is_bug else 1
        expect(on_call == want, plan, f"{on_call} doctor(s) on call in shift {shift}, expected {want}")
        facts: dict[str, Any] = {"shift": shift, "on_call_after": on_call}
        if plan.kind == "control:serializable_retry":
            expect("attempt 2" in outcomes[1].error, plan, f"the follower did not retry: {outcomes[1].error}")
            facts["follower"] = outcomes[1].error
        return Evidence(plan.rows, (plan.leader.writes, plan.follower.writes), facts)
