"""Transactions read from the spans around the statements, and what they change about a trace's accesses."""

from __future__ import annotations

import json
from pathlib import Path

from processors.model.events import Access, DbCall, LockMode, Resource, Scalar, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.accesses import accesses_of, within_transactions
from processors.sql import SqlAccessExtractor
from processors.sql.transactions import EXPLICIT, NEXT, OPEN, transactions

MS = 1_000_000
T = "ab" * 16
RECORDED = json.loads((Path(__file__).parent / "fixtures" / "orm_statements.json").read_text())


def statement(stack: str, step: str, index: int = 0) -> str:
    """The ``index``-th statement recorded for ``step`` of ``stack`` (tests/orm_recorder.py)."""
    found = [r["attributes"]["db.statement"] for r in RECORDED
             if (r["stack"], r["step"]) == (stack, step) and "db.statement" in r["attributes"]]  # fmt: skip
    return str(found[index])


Step = tuple[str, str, dict[str, Scalar] | tuple[Scalar, ...]]  # (span name, statement, parameters)
CONNECT: Step = ("connect", "", {})  # SQLAlchemy's Engine.connect span: a DB client span without a statement


def trace(*steps: Step, overlap: bool = False) -> ClosedTrace:
    """A request whose DB client spans run one after the other (10 ms apart, 5 ms each; ``overlap``: 15 ms each)."""
    spans = [Span(T, "f" * 16, "", "POST /withdraw", SpanKind.SERVER, 0, 1_000 * MS, StatusCode.UNSET,
                  Resource("bank"), route="/withdraw")]  # fmt: skip
    for i, (name, sql, named) in enumerate(steps, start=1):
        if isinstance(named, dict):
            db = DbCall("postgresql", sql, named_params=tuple(named.items()))
        else:
            db = DbCall("postgresql", sql, params=named)
        end = (i * 10 + (15 if overlap else 5)) * MS
        spans.append(Span(T, f"{i:016x}", "f" * 16, name, SpanKind.CLIENT, i * 10 * MS, end, StatusCode.UNSET,
                          Resource("bank"), db=db))  # fmt: skip
    return ClosedTrace(T, tuple(spans))


def accesses(t: ClosedTrace) -> list[Access]:
    return accesses_of(t, SqlAccessExtractor(key_columns={"accounts": ["id"]}))


SA = "sqlalchemy+psycopg"
LOCK: Step = ("SELECT", statement(SA, "orm_for_update"), {"id_1": 1})
WRITE: Step = ("UPDATE", statement(SA, "orm_change_commit"),
               {"balance": 90, "version": 2, "accounts_id": 1, "accounts_version": 1})  # fmt: skip


def test_each_sqlalchemy_checkout_begins_a_transaction() -> None:
    """The recorded SQLAlchemy run, as one trace: a ``connect`` span opens each session transaction (the connection
    goes back to the pool at commit), so the statements of one ``session.commit()`` share a transaction."""
    recorded = [r for r in RECORDED if r["stack"] == SA and r["step"] != "teardown"]
    steps = [(r["name"], r["attributes"].get("db.statement", ""), {}) for r in recorded]
    t = trace(*steps)
    txs = transactions(t.spans)
    ordinal = {r["step"]: txs[s.span_id].ordinal for r, s in zip(recorded, t.spans[1:], strict=True) if s.db
               and s.db.statement}  # fmt: skip
    assert ordinal["orm_get"] == ordinal["orm_change_commit"] == 0  # get, change, commit
    assert ordinal["orm_select_where"] == ordinal["orm_for_update"] == ordinal["orm_atomic_update"] == 1
    assert ordinal["orm_insert_returning"] == 2
    assert ordinal["core_select"] == ordinal["core_delete"] == max(ordinal.values())  # one engine.begin() block
    assert {tx.ended_by for tx in txs.values()} == {NEXT, OPEN}


def test_a_lock_released_at_commit_guards_no_later_write() -> None:
    """SELECT ... FOR UPDATE, commit, then the UPDATE in the session's next transaction: the lock was gone."""
    read, write = accesses(trace(CONNECT, LOCK, CONNECT, WRITE))
    assert (read.entity, read.lock) == ("accounts:1", LockMode.NONE)
    assert (write.entity, write.lock) == ("accounts:1", LockMode.OPTIMISTIC)


def test_a_lock_held_to_the_write_still_guards_it() -> None:
    """The same statements in one transaction (one checkout): the lock stands."""
    read, _ = accesses(trace(CONNECT, LOCK, WRITE))
    assert read.lock is LockMode.FOR_UPDATE


ASYNCPG = "asyncpg"
BEGIN: Step = ("BEGIN;", statement(ASYNCPG, "transaction_for_update", 0), {})
COMMIT: Step = ("COMMIT;", statement(ASYNCPG, "transaction_for_update", 3), {})
A_LOCK: Step = ("SELECT", statement(ASYNCPG, "transaction_for_update", 1), (1,))
A_WRITE: Step = ("UPDATE", statement(ASYNCPG, "transaction_for_update", 2), (80, 1))


def test_asyncpg_begin_and_commit_spans_delimit_transactions() -> None:
    """asyncpg's ``BEGIN;`` / ``COMMIT;`` spans: a lock in one ``transaction()`` guards no write in the next."""
    t = trace(BEGIN, A_LOCK, COMMIT, BEGIN, A_WRITE, COMMIT)
    assert [(tx.ordinal, tx.ended_by) for tx in (transactions(t.spans)[s.span_id] for s in t.spans[1:])] == [
        (0, EXPLICIT)] * 3 + [(1, EXPLICIT)] * 3  # fmt: skip
    read, _ = accesses(t)
    assert read.lock is LockMode.NONE
    read, _ = accesses(trace(BEGIN, A_LOCK, A_WRITE, COMMIT))
    assert read.lock is LockMode.FOR_UPDATE


def test_writes_of_a_rolled_back_transaction_made_no_change() -> None:
    """``ROLLBACK;`` ended the transaction: its write counts as failed (no row change can be its)."""
    rollback: Step = ("ROLLBACK;", "ROLLBACK;", {})
    _, write = accesses(trace(BEGIN, A_LOCK, A_WRITE, rollback))
    assert write.error
    _, write = accesses(trace(BEGIN, A_LOCK, A_WRITE, COMMIT))
    assert not write.error
    [write] = accesses(trace(BEGIN, A_WRITE, rollback))  # no row lock in the trace: the ROLLBACK alone decides
    assert write.error
    [write] = accesses(trace(BEGIN, A_WRITE, COMMIT))
    assert not write.error


def test_nothing_is_inferred_without_delimiters_or_with_concurrent_connections() -> None:
    """No checkout or BEGIN/COMMIT spans (psycopg2, Django): one transaction, as before; overlapping DB spans (two
    connections at once): which ran where is unknown, so the lock stands."""
    read, _ = accesses(trace(LOCK, WRITE))
    assert read.lock is LockMode.FOR_UPDATE
    read, _ = accesses(trace(CONNECT, LOCK, CONNECT, WRITE, overlap=True))
    assert read.lock is LockMode.FOR_UPDATE


def test_a_rollback_is_looked_for_among_the_spans_that_made_no_access_alone() -> None:
    """``accesses_of`` passes the DB spans that made no access (a ROLLBACK statement never makes one): what the
    transactions change is what looking at every DB span of the trace finds."""
    rollback: Step = ("ROLLBACK;", "ROLLBACK;", {})
    extractor = SqlAccessExtractor(key_columns={"accounts": ["id"]})
    for t in (trace(BEGIN, A_LOCK, A_WRITE, rollback), trace(BEGIN, A_WRITE, rollback), trace(BEGIN, A_WRITE, COMMIT)):
        made = [a for s in t.facts.db for a in extractor.accesses(s)]
        silent = [s for s in t.facts.db if not extractor.accesses(s)]
        assert within_transactions(t, made, silent) == within_transactions(t, made)
        rolled_back = t.spans[-1].name == "ROLLBACK;"
        assert t.spans[1] in silent and t.spans[-1] in silent  # BEGIN, and the ROLLBACK or COMMIT that ends it
        assert any(a.error for a in within_transactions(t, made, silent)) is rolled_back
    # (the spans passed are those looked at: without the ROLLBACK among them, a trace with no row lock is left as is)
    t = trace(BEGIN, A_WRITE, rollback)
    made = [a for s in t.facts.db for a in extractor.accesses(s)]
    assert not any(a.error for a in within_transactions(t, made, []))
