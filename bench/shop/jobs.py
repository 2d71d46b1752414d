"""Background jobs (no HTTP request: each run is its own root span, ``job <name>``)."""

from __future__ import annotations

from typing import Any

import psycopg

from bench.shop.handlers import READ_ORDER, SET_STATUS, audit_transition, one_row
from bench.shop.race import race_point


def expire_cart(conn: psycopg.Connection, order_id: int, *, clean: bool = False) -> dict[str, Any]:
    """Cancel a still-'pending' order whose cart expired. Buggy: unlocked read, then an unconditional UPDATE
    (see ``handlers`` for the race with ``capture_payment``). Clean: the read takes the row lock."""
    with conn.transaction(), conn.cursor() as cur:
        if clean:
            race_point()
            row = cur.execute(READ_ORDER + " FOR UPDATE", (order_id,)).fetchone()
        else:
            row = cur.execute(READ_ORDER, (order_id,)).fetchone()
        if row is None or row[0] != "pending":
            return {"order_id": order_id, "expired": False}
        version = row[1]
        if not clean:
            race_point()
        (written,) = one_row(cur.execute(SET_STATUS, ("cancelled", order_id)).fetchone(), f"order {order_id}")
    audit_transition(order_id, version, written)
    return {"order_id": order_id, "expired": True}
