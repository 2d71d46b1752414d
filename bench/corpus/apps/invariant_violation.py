"""Invariant violation (oversell): two buyers of the last unit both pass the stock check and both decrement.

``buy(item)`` reads ``qty`` (``SELECT qty ... WHERE item = %s``), and with at least one unit left takes one with a
*relative* decrement (``UPDATE ... SET qty = qty - 1 WHERE item = %s RETURNING qty``); after the commit it allocates
the unit, which fails with ``Oversold`` (500) when the returned quantity is negative. Two buyers race at READ
COMMITTED on an item with one unit: both read 1; the leader decrements to 0 and commits; the follower's UPDATE,
sent while the leader still held the row lock, waits for it, is re-evaluated on the new version and decrements to
-1. Both commit; the follower's allocation fails after its commit. No update was lost (the final qty accounts for
both decrements, each applied to the newest version): what broke is the invariant ``qty >= 0`` that the buyers'
check was meant to protect.

In Adya's terms the follower's check read q1 = 1, which the leader replaced with q2 = 0 (follower --rw--> leader),
and the follower then installed q3 = -1 after q2 (leader --ww--> follower): a G-single cycle, but on an item whose
writes are relative, so it does not show as a lost update: what shows is the committed after-image breaking the
predicate the read checked (``qty >= 1`` at read time, ``qty = -1`` after). The class is ``invariant_violation``,
never ``lost_update``.

Culprit: the request that committed first (it took the last unit); victim: the one that failed with ``Oversold``.

Control (no anomaly): ``buy_guarded`` decrements with the check in the statement (``... WHERE item = %s AND qty >= 1
RETURNING qty``); the follower's UPDATE is re-evaluated after the lock wait, matches no row, and refuses (409).

Table ``corpus_stock(item text PRIMARY KEY, qty int)``: keyed by ``item``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import BUG, Contender, Evidence, Expectation, RoundPlan, Scenario, Table, expect
from bench.corpus.service import CorpusError, Outcome, Refused

STOCK = Table("corpus_stock", "CREATE TABLE corpus_stock (item text PRIMARY KEY, qty int NOT NULL)", ("item",))
READ = "SELECT qty FROM corpus_stock WHERE item = %s"
TAKE = "UPDATE corpus_stock SET qty = qty - 1 WHERE item = %s RETURNING qty"
TAKE_GUARDED = "UPDATE corpus_stock SET qty = qty - 1 WHERE item = %s AND qty >= 1 RETURNING qty"
ROUTE = "/items/{item}/buy"


class SoldOut(Refused):
    """No unit left."""


class Oversold(CorpusError):
    """Allocation after the commit found no unit: the stock counter went below zero."""


def _qty(row: Any, item: str) -> int:
    if row is None:
        raise SoldOut(f"no item {item}")
    return int(row[0])


def buy(conn: psycopg.Connection, item: str) -> dict[str, Any]:
    """Buggy: the stock check is a separate, unlocked read; the decrement does not repeat it."""
    with conn.transaction(), conn.cursor() as cur:
        qty = _qty(cur.execute(READ, (item,)).fetchone(), item)
        if qty < 1:
            raise SoldOut(f"{item} is sold out")
        race_point()
        left = _qty(cur.execute(TAKE, (item,)).fetchone(), item)
        race_point("written")
    race_point("committed")
    if left < 0:
        raise Oversold(f"{item} oversold: no unit left to allocate (qty is now {left})")
    return {"item": item, "read": qty, "left": left}


def buy_guarded(conn: psycopg.Connection, item: str) -> dict[str, Any]:
    """Control: the decrement carries the check (``AND qty >= 1``); no row updated means sold out."""
    with conn.transaction(), conn.cursor() as cur:
        qty = _qty(cur.execute(READ, (item,)).fetchone(), item)
        if qty < 1:
            raise SoldOut(f"{item} is sold out")
        race_point()
        row = cur.execute(TAKE_GUARDED, (item,)).fetchone()
        if row is None:
            raise SoldOut(f"{item} sold out meanwhile")
        race_point("written")
    race_point("committed")
    return {"item": item, "read": qty, "left": int(row[0])}


class InvariantViolation(Scenario):
    name: ClassVar[str] = "invariant_violation"
    tables: ClassVar[tuple[Table, ...]] = (STOCK,)
    kinds: ClassVar[tuple[str, ...]] = (BUG, "control:conditional_update")

    def plan(self, kind: str, number: int) -> RoundPlan:
        item = f"item-{number}"
        row = STOCK.entity(item)
        handler = buy if kind == BUG else buy_guarded
        leader, follower = (Contender(handler, ROUTE, f"/items/{item}/buy", (item,), (row,)) for _ in range(2))
        plan = Choreography("written", hold_s=0.05)  # the follower's UPDATE waits for the leader's row lock
        if kind == BUG:
            return RoundPlan(kind, number, (row,), leader, follower, plan, (200, 500),
                             Expectation("invariant_violation", "leader", "follower"))  # fmt: skip
        return RoundPlan(kind, number, (row,), leader, follower, plan, (200, 409))

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO corpus_stock (item, qty) VALUES (%s, 1)", [p.leader.args for p in plans])

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        item = plan.leader.args[0]
        row = conn.execute("SELECT qty FROM corpus_stock WHERE item = %s", (item,)).fetchone()
        qty = row[0] if row else None
        want = -1 if plan.is_bug else 0
        expect(qty == want, plan, f"qty {qty}, expected {want}")
        if plan.is_bug:
            expect("Oversold" in outcomes[1].error, plan, f"the follower answered {outcomes[1].error!r}")
        return Evidence(plan.rows, (plan.leader.writes, plan.follower.writes), {"opening": 1, "qty": qty})
