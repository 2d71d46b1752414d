"""Shipping: a row lock held across a slow external call (the blocked-by defect) and its fix (``clean=True``).

ship_order (``POST /orders/{order_id}/ship``) books a carrier for an order and marks it shipped.
    Buggy (v1.0.0): ``SELECT status, version, amount FROM orders WHERE id = %s FOR UPDATE`` → race point → the
    carrier's booking API (``book_carrier``: a slow call outside the database, held inside the transaction) →
    ``UPDATE orders SET status = %s, version = version + 1 WHERE id = %s`` → commit. Every other writer of the
    order waits for the whole booking: apply_discount's UPDATE returns only when ship_order commits.
    Clean (v1.1.0): the carrier is booked first, outside the transaction; then race point → the same locking read
    and UPDATE → commit: the lock is held for two statements, and apply_discount waits a few milliseconds at most.

apply_discount (``POST /orders/{order_id}/discount``) takes a discount off an order's amount: race point →
    ``UPDATE orders SET amount = amount - %s, version = version + 1 WHERE id = %s RETURNING amount`` (an atomic
    update: no lost update with ship_order) → commit. It reports how long its UPDATE took (``update_ms``), so that
    the traffic can tell which rounds really waited. It is the same in both builds: it is the victim.

Unlike the other defects, no repair planner fixes this one (its remedy class is ``shorten_lock_hold``: move the
slow work out of the transaction); the fix ships in v1.1.0 as a person would write it (``FIXED_IN``), so a shop
run as 1.1.0 or later runs it (``fixed``) whether or not the other fixes' flag is on.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.shop.errors import NotFound
from bench.shop.race import race_point

CARRIER_S = 0.3  # the carrier's booking API: a slow call to another system, standing for an HTTP request
FIXED_IN = (1, 1, 0)  # the release that books the carrier before the transaction
LOCK_ORDER = "SELECT status, version, amount FROM orders WHERE id = %s FOR UPDATE"
MARK_SHIPPED = "UPDATE orders SET status = %s, version = version + 1 WHERE id = %s"
DISCOUNT = "UPDATE orders SET amount = amount - %s, version = version + 1 WHERE id = %s RETURNING amount"


def fixed(version: str) -> bool:
    """Whether a shop run as ``version`` ships the lock-hold fix (``FIXED_IN`` or later; unparsable: no)."""
    try:
        parts = tuple(int(p) for p in version.split("-")[0].split("."))
    except ValueError:
        return False
    return parts >= FIXED_IN


def book_carrier(order_id: int) -> str:
    """The carrier's booking API (slow: another system over the network)."""
    time.sleep(CARRIER_S)
    return f"parcel-{order_id}"


def _mark_shipped(cur: psycopg.Cursor[Any], order_id: int) -> None:
    if cur.execute(LOCK_ORDER, (order_id,)).fetchone() is None:
        raise NotFound(f"order {order_id} not found")


def ship_order(conn: psycopg.Connection, order_id: int, *, clean: bool = False) -> dict[str, Any]:
    parcel = book_carrier(order_id) if clean else ""
    with conn.transaction(), conn.cursor() as cur:
        if clean:
            race_point()
        _mark_shipped(cur, order_id)
        if not clean:
            race_point()
            parcel = book_carrier(order_id)  # the lock on the order is held across the call
        cur.execute(MARK_SHIPPED, ("shipped", order_id))
    return {"order_id": order_id, "status": "shipped", "parcel": parcel}


def apply_discount(conn: psycopg.Connection, order_id: int, cents: int, *, clean: bool = False) -> dict[str, Any]:
    with conn.transaction(), conn.cursor() as cur:
        race_point()
        began = time.monotonic()
        row = cur.execute(DISCOUNT, (cents, order_id)).fetchone()
        update_ms = (time.monotonic() - began) * 1000
    if row is None:
        raise NotFound(f"order {order_id} not found")
    return {"order_id": order_id, "amount": int(row[0]), "update_ms": round(update_ms, 3)}
