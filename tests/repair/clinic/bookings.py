"""Booking a room for a day: allowed when nobody has booked it yet.

The check looks the booking up, unlocked; two guests booking the same room and day at once both find none and both
insert one: a phantom (G2, the predicate double insert). There is no idempotency key: the two are different
requests.
"""

from __future__ import annotations

from typing import Any

import psycopg


def book(conn: psycopg.Connection[Any], room: int, day: str, guest: str) -> int:
    with conn.transaction(), conn.cursor() as cur:
        taken = cur.execute("SELECT id FROM bookings WHERE room = %s AND day = %s", (room, day)).fetchone()
        if taken is not None:
            return -1
        row = cur.execute(
            "INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s) RETURNING id", (room, day, guest)
        ).fetchone()
    return int(row[0]) if row is not None else -1
