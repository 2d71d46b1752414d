"""Phantom (Adya G2, predicate-based): two bookings of one room for one day, each after checking there was none.

``book(room, day, guest)`` looks for a booking of the room on that day (``SELECT booking_id ... WHERE room = %s
AND day = %s``); finding none, it inserts one. Two guests race at READ COMMITTED: both find no booking, the leader
inserts and commits, then the follower inserts and commits. The room is booked twice. No row was overwritten and
no row was read by one and written by the other: the conflict is on the *predicate* ``room = r AND day = d``, whose
matching set the leader's insert changed after the follower had read it.

In Adya's terms the follower's predicate read observed a state of ``room = r AND day = d`` that the leader's insert
then changed (a predicate anti-dependency, follower --rw--> leader), and the leader's read is changed by the
follower's insert likewise (leader --rw--> follower): a cycle of predicate anti-dependencies, G2 (phantom), which
no row lock prevents because the row did not exist. Debezium shows two inserts (``op: c``) of two different rows
with the same (room, day) and their own ``booking_id`` keys (a ``serial`` the database assigns).

Culprit: the request whose insert committed first; victim: the other one.

Control (no anomaly): ``book_safe`` on ``corpus_bookings_safe``, which has ``UNIQUE (room, day)``, inserts with
``ON CONFLICT (room, day) DO NOTHING RETURNING booking_id``: the follower's insert waits for the leader's
uncommitted index entry, then does nothing; with no row returned it refuses (409). One booking.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg

from bench.corpus.race import Choreography, race_point
from bench.corpus.scenario import BUG, Contender, Evidence, Expectation, RoundPlan, Scenario, Table, expect
from bench.corpus.service import Outcome, Refused

BOOKINGS = Table(
    "corpus_bookings",
    "CREATE TABLE corpus_bookings (booking_id serial PRIMARY KEY, room int NOT NULL, day text NOT NULL,"
    " guest text NOT NULL)",
    ("booking_id",),
)
SAFE = Table(
    "corpus_bookings_safe",
    "CREATE TABLE corpus_bookings_safe (booking_id serial PRIMARY KEY, room int NOT NULL, day text NOT NULL,"
    " guest text NOT NULL, UNIQUE (room, day))",
    ("booking_id",),
)
FIND = "SELECT booking_id FROM corpus_bookings WHERE room = %s AND day = %s"
INSERT = "INSERT INTO corpus_bookings (room, day, guest) VALUES (%s, %s, %s) RETURNING booking_id"
FIND_SAFE = "SELECT booking_id FROM corpus_bookings_safe WHERE room = %s AND day = %s"
INSERT_SAFE = ("INSERT INTO corpus_bookings_safe (room, day, guest) VALUES (%s, %s, %s)"
               " ON CONFLICT (room, day) DO NOTHING RETURNING booking_id")  # fmt: skip
ROUTE = "/rooms/{room}/bookings"
DAY = "2030-01-15"
GUESTS = ("ada", "bo")  # the leader's and the follower's guest


class RoomTaken(Refused):
    """The room is already booked that day."""


def book(conn: psycopg.Connection, room: int, day: str, guest: str) -> dict[str, Any]:
    """Buggy: check-then-insert with nothing that makes the check and the insert atomic."""
    with conn.transaction(), conn.cursor() as cur:
        if cur.execute(FIND, (room, day)).fetchone() is not None:
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        row = cur.execute(INSERT, (room, day, guest)).fetchone()
        race_point("written")
    race_point("committed")
    return {"room": room, "day": day, "guest": guest, "booking_id": row[0] if row else None}


def book_safe(conn: psycopg.Connection, room: int, day: str, guest: str) -> dict[str, Any]:
    """Control: the unique constraint decides; the loser's ``ON CONFLICT DO NOTHING`` returns no row."""
    with conn.transaction(), conn.cursor() as cur:
        if cur.execute(FIND_SAFE, (room, day)).fetchone() is not None:
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        row = cur.execute(INSERT_SAFE, (room, day, guest)).fetchone()
        if row is None:
            raise RoomTaken(f"room {room} was booked on {day} meanwhile")
        race_point("written")
    race_point("committed")
    return {"room": room, "day": day, "guest": guest, "booking_id": row[0]}


class Phantom(Scenario):
    name: ClassVar[str] = "phantom"
    tables: ClassVar[tuple[Table, ...]] = (BOOKINGS, SAFE)
    kinds: ClassVar[tuple[str, ...]] = (BUG, "control:unique_on_conflict")

    def plan(self, kind: str, number: int) -> RoundPlan:
        room = 100 + number  # one room per round: the rounds' predicates never overlap
        handler = book if kind == BUG else book_safe
        leader, follower = (Contender(handler, ROUTE, f"/rooms/{room}/bookings", (room, DAY, g)) for g in GUESTS)
        if kind == BUG:  # both found no booking; the follower inserts once the leader committed
            return RoundPlan(kind, number, (), leader, follower, Choreography("committed"), (200, 200),
                             Expectation("phantom", "leader", "follower"))  # fmt: skip
        # The leader holds its uncommitted index entry a while: the follower's insert waits for it.
        return RoundPlan(kind, number, (), leader, follower, Choreography("written", hold_s=0.05), (200, 409))

    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        """No rows: the rooms start free."""

    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        table = BOOKINGS if plan.is_bug else SAFE
        room, day = plan.leader.args[0], plan.leader.args[1]
        found = conn.execute(f"SELECT booking_id, guest FROM {table.name} WHERE room = %s AND day = %s"
                             " ORDER BY booking_id", (room, day)).fetchall()  # fmt: skip
        want = 2 if plan.is_bug else 1
        expect(len(found) == want, plan, f"{len(found)} booking(s) of room {room}, expected {want}")
        by_guest = {guest: (table.entity(booking_id),) for booking_id, guest in found}
        rows = tuple(table.entity(booking_id) for booking_id, _ in found)
        writes = (by_guest.get(GUESTS[0], ()), by_guest.get(GUESTS[1], ()))
        return Evidence(rows, writes, {"room": room, "day": day, "bookings": [[b, g] for b, g in found]})
