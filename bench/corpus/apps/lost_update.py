"""Lost update: two deposits read one balance and both write the value they computed from it.

``deposit(account_no, amount)`` reads ``balance`` without a lock, computes ``balance + amount`` in Python and writes
that value back. Two deposits race at READ COMMITTED: both read the same balance x0; the leader writes x0 + 10 and
commits; the follower's UPDATE, sent while the leader still held the row lock (so it waited for it), writes x0 + 25,
computed from x0 too, and commits. Both requests succeed and the balance shows one deposit: the leader's is gone.

In Adya's terms the follower read x0, which the leader's version x1 replaced (follower --rw--> leader), and then
installed x2 right after x1 (leader --ww--> follower): a cycle with exactly one anti-dependency edge, G-single, on a
single object (Berenson et al.'s P4). Debezium shows it as two updates of the row where the second's before-image is
the first's after-image while its statement set a value computed from the older balance.

Culprit: the request whose UPDATE committed first (its write was lost); victim: the one that overwrote it.

Controls (no anomaly):

- ``deposit_locked``: ``SELECT ... FOR UPDATE`` after the race point; the follower's locking read waits for the
  leader's commit and reads the new balance: the final balance has both deposits.
- ``deposit_atomic``: the same unlocked read, then ``UPDATE ... SET balance = balance + %s``: a relative update is
  re-evaluated on the newest row version after the lock wait, so no increment is lost (however stale the read).

Table ``corpus_accounts(account_no text PRIMARY KEY, balance int)``: keyed by ``account_no``, not ``id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import BUG, Contender, Evidence, Expectation, RoundPlan, Scenario, Table, expect
from bench.corpus.service import Outcome, Refused

ACCOUNTS = Table(
    "corpus_accounts",
    "CREATE TABLE corpus_accounts (account_no text PRIMARY KEY, balance int NOT NULL)",
    ("account_no",),
)
READ = "SELECT balance FROM corpus_accounts WHERE account_no = %s"
WRITE = "UPDATE corpus_accounts SET balance = %s WHERE account_no = %s"
ADD = "UPDATE corpus_accounts SET balance = balance + %s WHERE account_no = %s"
OPENING = 100
AMOUNTS = (10, 25)  # the leader's and the follower's deposits
ROUTE = "/accounts/{account_no}/deposits"


def _balance(row: Any, account_no: str) -> int:
    if row is None:
        raise Refused(f"no account {account_no}")
    return int(row[0])


def deposit(conn: psycopg.Connection, account_no: str, amount: int) -> dict[str, Any]:
    """Buggy: unlocked read, the new balance computed here, written back unconditionally."""
    with conn.transaction(), conn.cursor() as cur:
        balance = _balance(cur.execute(READ, (account_no,)).fetchone(), account_no)
        race_point()
        cur.execute(WRITE, (balance + amount, account_no))
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "read": balance, "balance": balance + amount}


def deposit_locked(conn: psycopg.Connection, account_no: str, amount: int) -> dict[str, Any]:
    """Control: the read takes the row lock (``FOR UPDATE``), so a concurrent deposit waits and reads our result."""
    with conn.transaction(), conn.cursor() as cur:
        race_point()
        balance = _balance(cur.execute(READ + " FOR UPDATE", (account_no,)).fetchone(), account_no)
        cur.execute(WRITE, (balance + amount, account_no))
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "read": balance, "balance": balance + amount}


def deposit_atomic(conn: psycopg.Connection, account_no: str, amount: int) -> dict[str, Any]:
    """Control: the same unlocked read, but the write is relative (``balance = balance + %s``)."""
    with conn.transaction(), conn.cursor() as cur:
        balance = _balance(cur.execute(READ, (account_no,)).fetchone(), account_no)
        race_point()
        cur.execute(ADD, (amount, account_no))
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "read": balance}


class LostUpdate(Scenario):
    name: ClassVar[str] = "lost_update"
    tables: ClassVar[tuple[Table, ...]] = (ACCOUNTS,)
    kinds: ClassVar[tuple[str, ...]] = (BUG, "control:for_update", "control:atomic_update")
    handlers: ClassVar[dict[str, Any]] = {BUG: deposit, "control:for_update": deposit_locked,
                                          "control:atomic_update": deposit_atomic}  # fmt: skip

    @staticmethod
    def account(number: int, kind: str) -> str:
        return f"acc-{number}-{kind.removeprefix('control:')}"

    def plan(self, kind: str, number: int) -> RoundPlan:
        account = self.account(number, kind)
        row = ACCOUNTS.entity(account)
        path = f"/accounts/{account}/deposits"
        leader, follower = (
            Contender(self.handlers[kind], ROUTE, path, (account, amount), (row,)) for amount in AMOUNTS
        )
        # The leader holds its row lock a little while: the follower's UPDATE (or locking read) waits for it.
        expected = Expectation("lost_update", "leader", "follower") if kind == BUG else None
        return RoundPlan(
            kind, number, (row,), leader, follower, Choreography("written", hold_s=0.05), (200, 200), expected
        )

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO corpus_accounts (account_no, balance) VALUES (%s, %s)",
                            [(p.leader.args[0], OPENING) for p in plans])  # fmt: skip

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        account = plan.leader.args[0]
        row = conn.execute("SELECT balance FROM corpus_accounts WHERE account_no = %s", (account,)).fetchone()
        balance = row[0] if row else None
        want = OPENING + AMOUNTS[1] if plan.is_bug else OPENING + sum(AMOUNTS)
        expect(balance == want, plan, f"balance {balance}, expected {want}")
        return Evidence(plan.rows, (plan.rows, plan.rows), {"opening": OPENING, "deposits": list(AMOUNTS),
                                                            "balance": balance})  # fmt: skip
