"""Relative updates (a control only): two buyers decrement a stock of five; both succeed and nothing is wrong.

The same code as ``invariant_violation.buy`` (an unlocked ``SELECT qty``, then ``UPDATE ... SET qty = qty - 1 WHERE
item = %s RETURNING qty``) on an item with five units. Two buyers race exactly as there: both read 5, the leader
decrements to 4 and commits, the follower's UPDATE waits for the leader's row lock, is re-evaluated on the new
version and decrements to 3. Both requests answer 200; the quantity is 3, as two sales of five units must leave it.

Not an anomaly in Adya's terms either: the follower's read of q1 = 5 is replaced by the leader's q2 (an
anti-dependency), but the follower's write depends on q2, not on what it read (it is applied to the newest version):
the history is equivalent to the serial order leader, follower. Two relative writes of one row inside a causal
window, with a stale read before them, are therefore never a lost update; and with no invariant broken (qty >= 0
holds) never an invariant violation. Detection must stay silent.

Table ``corpus_shelf(item text PRIMARY KEY, qty int)``: keyed by ``item`` (a table of its own, so the scenario's
row changes are on a topic of their own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import Contender, Evidence, RoundPlan, Scenario, Table, expect
from bench.corpus.service import Outcome, Refused

SHELF = Table("corpus_shelf", "CREATE TABLE corpus_shelf (item text PRIMARY KEY, qty int NOT NULL)", ("item",))
READ = "SELECT qty FROM corpus_shelf WHERE item = %s"
TAKE = "UPDATE corpus_shelf SET qty = qty - 1 WHERE item = %s RETURNING qty"
OPENING = 5
KIND = "control:two_decrements"


class SoldOut(Refused):
    """No unit left."""


def buy(conn: psycopg.Connection, item: str) -> dict[str, Any]:
    """An unlocked stock check, then a relative decrement (the invariant_violation scenario's buggy ``buy``)."""
    with conn.transaction(), conn.cursor() as cur:
        row = cur.execute(READ, (item,)).fetchone()
        if row is None or row[0] < 1:
            raise SoldOut(f"{item} is sold out")
        race_point()
        left = cur.execute(TAKE, (item,)).fetchone()
        race_point("written")
    race_point("committed")
    return {"item": item, "read": row[0], "left": left[0] if left else None}


class RelativeUpdates(Scenario):
    name: ClassVar[str] = "relative_updates"
    tables: ClassVar[tuple[Table, ...]] = (SHELF,)
    kinds: ClassVar[tuple[str, ...]] = (KIND,)

    def plan(self, kind: str, number: int) -> RoundPlan:
        item = f"shelf-{number}"
        row = SHELF.entity(item)
        leader, follower = (Contender(buy, "/items/{item}/buy", f"/items/{item}/buy", (item,), (row,)) for _ in "ab")
        return RoundPlan(kind, number, (row,), leader, follower, Choreography("written", hold_s=0.05), (200, 200))

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO corpus_shelf (item, qty) VALUES (%s, %s)",
                            [(p.leader.args[0], OPENING) for p in plans])  # fmt: skip

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        item = plan.leader.args[0]
        row = conn.execute("SELECT qty FROM corpus_shelf WHERE item = %s", (item,)).fetchone()
        qty = row[0] if row else None
        expect(qty == OPENING - 2, plan, f"qty {qty}, expected {OPENING - 2}")
        lefts = sorted((o.result or {}).get("left", 0) for o in outcomes)
        expect(lefts == [OPENING - 2, OPENING - 1], plan, f"the buyers were left with {lefts}")
        return Evidence(plan.rows, (plan.leader.writes, plan.follower.writes), {"opening": OPENING, "qty": qty})
