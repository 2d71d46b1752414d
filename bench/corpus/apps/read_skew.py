"""Read skew (Adya G-single): an audit reads one account before a transfer and the other one after it.

``transfer(source, target, amount)`` moves money between two ledger accounts in one transaction (``UPDATE ... SET
balance = balance - %s`` then ``... balance + %s``); the total stays 100. ``audit(first, second, total)`` reads the
two balances with two statements and fails with ``AuditMismatch`` (500) when they do not add up to the total. At
READ COMMITTED every statement sees the data committed before *it* started: the audit reads account a (50), the
transfer commits (a = 40, b = 60), the audit reads b (60) and sees 110. No write was lost and the database never held
an inconsistent state; the audit observed one that never existed.

In Adya's terms the audit read a0, which the transfer replaced (audit --rw--> transfer), and read b1, which the
transfer installed (transfer --wr--> audit): a cycle with exactly one anti-dependency edge, G-single (read skew),
forbidden by PL-2+ (consistent view, e.g. snapshot isolation), allowed by READ COMMITTED. Debezium shows only the
transfer's two updates; the audit writes nothing: the evidence is in the audit's spans (its two reads, their times
and the error) against the transfer's commit.

Culprit: the transfer; victim: the audit.

Control (no anomaly): ``audit_snapshot`` reads both balances in ONE statement (``SELECT acct, balance ... WHERE
acct IN (%s, %s)``), at the point where the buggy audit read the first account, and then waits at the same race
point while the transfer commits: one statement sees one consistent state (the sum is 100).

Table ``corpus_ledger(acct text PRIMARY KEY, balance int)``: keyed by ``acct``; each round has its own two accounts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import BUG, Contender, Evidence, Expectation, RoundPlan, Scenario, Table, expect
from bench.corpus.service import CorpusError, Outcome, Refused

LEDGER = Table("corpus_ledger", "CREATE TABLE corpus_ledger (acct text PRIMARY KEY, balance int NOT NULL)", ("acct",))
DEBIT = "UPDATE corpus_ledger SET balance = balance - %s WHERE acct = %s"
CREDIT = "UPDATE corpus_ledger SET balance = balance + %s WHERE acct = %s"
READ = "SELECT balance FROM corpus_ledger WHERE acct = %s"
READ_BOTH = "SELECT acct, balance FROM corpus_ledger WHERE acct IN (%s, %s)"
TOTAL = 100
AMOUNT = 10


class AuditMismatch(CorpusError):
    """The balances do not add up to the ledger's total."""


def _balance(row: Any, acct: str) -> int:
    if row is None:
        raise Refused(f"no account {acct}")
    return int(row[0])


def transfer(conn: psycopg.Connection, source: str, target: str, amount: int) -> dict[str, Any]:
    """Move ``amount`` from ``source`` to ``target``: two relative updates in one transaction."""
    with conn.transaction(), conn.cursor() as cur:
        race_point()
        cur.execute(DEBIT, (amount, source))
        cur.execute(CREDIT, (amount, target))
        race_point("written")
    race_point("committed")
    return {"source": source, "target": target, "amount": amount}


def audit(conn: psycopg.Connection, first: str, second: str, total: int) -> dict[str, Any]:
    """Buggy: one statement per account, so each sees a different committed state."""
    with conn.transaction(), conn.cursor() as cur:
        a = _balance(cur.execute(READ, (first,)).fetchone(), first)
        race_point()
        b = _balance(cur.execute(READ, (second,)).fetchone(), second)
        if a + b != total:
            raise AuditMismatch(f"{first} + {second} = {a} + {b} = {a + b}, the ledger says {total}")
    race_point("committed")
    return {first: a, second: b}


def audit_snapshot(conn: psycopg.Connection, first: str, second: str, total: int) -> dict[str, Any]:
    """Control: both balances from one statement, one consistent state."""
    with conn.transaction(), conn.cursor() as cur:
        balances = {acct: int(balance) for acct, balance in cur.execute(READ_BOTH, (first, second)).fetchall()}
        race_point()
        if sum(balances.values()) != total:
            raise AuditMismatch(f"{balances} do not add up to {total}")
    race_point("committed")
    return balances


class ReadSkew(Scenario):
    name: ClassVar[str] = "read_skew"
    tables: ClassVar[tuple[Table, ...]] = (LEDGER,)
    kinds: ClassVar[tuple[str, ...]] = (BUG, "control:one_statement")

    @staticmethod
    def accounts(number: int) -> tuple[str, str]:
        return f"a-{number}", f"b-{number}"

    def plan(self, kind: str, number: int) -> RoundPlan:
        first, second = self.accounts(number)
        rows = (LEDGER.entity(first), LEDGER.entity(second))
        leader = Contender(transfer, "/transfers", "/transfers", (first, second, AMOUNT), rows)
        follower = Contender(audit if kind == BUG else audit_snapshot, "/audits", "/audits", (first, second, TOTAL))
        # The audit waits at its race point until the transfer has committed, and 20 ms more.
        plan = Choreography("committed", delay_s=0.02)
        if kind == BUG:
            return RoundPlan(kind, number, rows, leader, follower, plan, (200, 500),
                             Expectation("read_skew", "leader", "follower"))  # fmt: skip
        return RoundPlan(kind, number, rows, leader, follower, plan, (200, 200))

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO corpus_ledger (acct, balance) VALUES (%s, %s)",
                            [(acct, TOTAL // 2) for p in plans for acct in p.leader.args[:2]])  # fmt: skip

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        first, second = plan.leader.args[0], plan.leader.args[1]
        balances: dict[str, int] = dict(conn.execute("SELECT acct, balance FROM corpus_ledger WHERE acct IN (%s, %s)",
                                     (first, second)).fetchall())  # fmt: skip
        expect(balances == {first: TOTAL // 2 - AMOUNT, second: TOTAL // 2 + AMOUNT}, plan, f"balances {balances}")
        if plan.is_bug:
            expect("AuditMismatch" in outcomes[1].error, plan, f"the audit answered {outcomes[1].error!r}")
        else:
            result = outcomes[1].result or {}
            expect(result == {first: TOTAL // 2, second: TOTAL // 2}, plan, f"the audit read {result}")
        return Evidence(plan.rows, (plan.leader.writes, ()), {"balances": balances, "audit": outcomes[1].error
                                                               or outcomes[1].result})  # fmt: skip
