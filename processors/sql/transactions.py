"""Which transaction each DB statement of a trace ran in, from the spans around it, with or without COMMIT spans.

Most stacks trace no COMMIT: psycopg / psycopg2 / dbapi and Django commit through the DB-API connection, which no
instrumentation traces, and SQLAlchemy's instrumentation traces statements and ``Engine.connect`` (a ``connect``
span), not ``commit()``. So the daemon's default is that a request's statements commit before the request ends
(``processors.correlation.engine`` bounds a write's commit by the statement's end and the request's end). Where the
spans say more, this module reads it, per service, over the service's DB spans in start order:

- **explicit**: ``BEGIN`` / ``START TRANSACTION`` ... ``COMMIT`` / ``ROLLBACK`` statement spans (asyncpg sends them
  through the calls its instrumentation traces; so does any app that issues them as SQL). SAVEPOINT, RELEASE and
  ROLLBACK TO stay inside their transaction.
- **checkout**: a SQLAlchemy ``connect`` span (no statement) starts the session's next transaction: a Session (and
  ``engine.begin()``) takes a connection from the engine at its first statement and gives it back at commit or
  rollback, so the statements between two ``connect`` spans of a service ran in one transaction, committed (or
  rolled back: not known) before the next began.
- A statement before a ``BEGIN`` span ran in an earlier transaction (or autocommitted).
- Otherwise nothing is inferred: all of a service's statements are taken as one transaction, as before.

Not inferred, and why: concurrent statements of one service in one trace (two connections at once: their spans
overlap) — which statement used which connection is not on the spans, so the service's statements are left as
one transaction; autocommit (asyncpg outside ``transaction()``, Django outside ``atomic()``: each statement its own
transaction) — the spans do not say whether a connection autocommits; a Core connection that commits several times
("commit as you go") between two checkouts — its commits are not spans; ``ROLLBACK TO SAVEPOINT`` — the writes it
undid still count as made.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

from processors.model.events import SpanKind
from processors.model.span import Span
from processors.sql.control import BEGIN, COMMIT, ROLLBACK, transaction_control

EXPLICIT: Final = "explicit"  # ended by a COMMIT / ROLLBACK statement span
NEXT: Final = "next_began"  # ended before the service's next one began (a SQLAlchemy ``connect``, a BEGIN span)
OPEN: Final = "open"  # not seen to end: commits before the request ends, as the daemon assumes without spans


@dataclass(frozen=True, slots=True)
class Transaction:
    """One transaction of one service in one trace: its ordinal there, how its end is known, and its outcome."""

    service: str
    ordinal: int  # 0, 1, ... in the order the service's transactions began in the trace
    ended_by: str  # EXPLICIT | NEXT | OPEN
    rolled_back: bool = False  # ended by a ROLLBACK statement span: its writes made no row change


def is_checkout(span: Span) -> bool:
    """A SQLAlchemy ``connect`` span: a DB client span without a statement, named ``connect``."""
    db = span.db
    return span.name == "connect" and span.kind == SpanKind.CLIENT and db is not None and not db.statement.strip()


def transactions(spans: Iterable[Span]) -> dict[str, Transaction]:
    """span id → its transaction, for every DB statement span of the trace (control statements included); a
    service whose DB spans overlap in time (more than one connection at once) is left out (nothing inferred)."""
    lanes: dict[str, list[Span]] = {}
    for s in spans:
        if s.db is not None:
            lanes.setdefault(s.resource.service, []).append(s)
    out: dict[str, Transaction] = {}
    for service, lane in lanes.items():
        lane.sort(key=lambda s: (s.start_ns, s.end_ns))
        if any(later.start_ns < earlier.end_ns for earlier, later in pairwise(lane)):
            continue  # concurrent connections: which statement ran in which transaction is not on the spans
        out.update(_lane(service, lane))
    return out


def _lane(service: str, lane: list[Span]) -> dict[str, Transaction]:
    """The transactions of one service's sequential DB spans."""
    members: list[list[str]] = [[]]
    ends: list[tuple[str, bool]] = []  # (ended_by, rolled_back) of each closed transaction, in order
    explicit = False

    def close(how: str, rolled_back: bool = False) -> None:
        ends.append((how, rolled_back))
        members.append([])

    for s in lane:
        assert s.db is not None
        if is_checkout(s):
            if not explicit and members[-1]:
                close(NEXT)
            continue
        kind = transaction_control(s.db.statement)
        if kind == BEGIN and not explicit:  # (a BEGIN inside a transaction changes nothing: PostgreSQL warns)
            if members[-1]:
                close(NEXT)
            explicit = True
        members[-1].append(s.span_id)
        if kind in (COMMIT, ROLLBACK) and explicit:
            close(EXPLICIT, kind == ROLLBACK)
            explicit = False
    ends.append((OPEN, False))
    out: dict[str, Transaction] = {}
    ordinal = 0
    for ids, (how, rolled_back) in zip(members, ends, strict=True):
        if ids:
            tx = Transaction(service, ordinal, how, rolled_back)
            out.update(dict.fromkeys(ids, tx))
            ordinal += 1
    return out


__all__ = ["EXPLICIT", "NEXT", "OPEN", "Transaction", "is_checkout", "transactions"]
