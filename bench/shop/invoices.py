"""Invoices: one shop-wide lock held across slow work (the contention defect) and its fix (``clean=True``).

issue_invoice (``POST /orders/{order_id}/invoice``) renders an order's invoice and numbers it.
    Buggy (v1.0.0): ``SELECT pg_advisory_xact_lock(%s)`` on the shop's one invoicing lock (so that invoices are
    numbered in the order they are issued) → render the invoice (``render``: slow work outside the database, held
    inside the transaction) → ``SELECT nextval(%s)`` (the number) → commit. Every invoice waits for every invoice
    in flight before it: the route's latency grows with its own concurrency. It reports how long it waited for
    the lock (``lock_wait_ms``), so that the traffic can tell which requests really queued.
    Clean (v1.1.0): the number comes from the sequence alone (a sequence needs no lock) and the invoice is
    rendered outside the transaction: requests in flight together do not wait for each other.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from bench.shop.errors import NotFound

ROUTE = "/orders/{order_id}/invoice"
RENDER_S = 0.02  # rendering an invoice (a template and a PDF): slow work, no database
INVOICE_LOCK = 0x1A7010  # the advisory lock every buggy invoice takes
LOCK = "SELECT pg_advisory_xact_lock(%s)"
NUMBER = "SELECT nextval(%s)"
SEQUENCE = "shop_order_ids"


def render(order_id: int) -> str:
    """The invoice's document (slow: templates and a PDF)."""
    time.sleep(RENDER_S)
    return f"invoice-{order_id}.pdf"


def issue_invoice(conn: psycopg.Connection, order_id: int, *, clean: bool = False) -> dict[str, Any]:
    waited_ms = 0.0
    if clean:
        document = render(order_id)
        with conn.transaction(), conn.cursor() as cur:
            row = cur.execute(NUMBER, (SEQUENCE,)).fetchone()
    else:
        with conn.transaction(), conn.cursor() as cur:
            began = time.monotonic()
            cur.execute(LOCK, (INVOICE_LOCK,))
            waited_ms = (time.monotonic() - began) * 1000
            document = render(order_id)  # the invoicing lock is held across the rendering
            row = cur.execute(NUMBER, (SEQUENCE,)).fetchone()
    if row is None:
        raise NotFound(f"no invoice number for order {order_id}")
    return {"order_id": order_id, "invoice": int(row[0]), "document": document, "lock_wait_ms": round(waited_ms, 3)}
