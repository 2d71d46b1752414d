"""Schema and seed data for the sample shop. Set-up and inspection are not the shop's traffic: their
statements run with instrumentation suppressed, so they never become spans."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from opentelemetry.instrumentation.utils import suppress_instrumentation

SCHEMA = Path(__file__).with_name("schema.sql")
TABLES = ("public.orders", "public.inventory", "public.charges")
_SCHEMA_LOCK = 0x5E0B  # advisory lock: concurrent runs must not race on CREATE TABLE IF NOT EXISTS


@contextmanager
def untraced(dsn: str) -> Iterator[psycopg.Connection]:
    """A connection (committed on success) whose statements are not traced."""
    with suppress_instrumentation(), psycopg.connect(dsn) as conn:
        yield conn


def apply_schema(dsn: str) -> None:
    """Create the shop's tables (idempotent) with ``REPLICA IDENTITY FULL``."""
    with untraced(dsn) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        conn.execute(SCHEMA.read_text())


def _next_ids(conn: psycopg.Connection, n: int) -> list[int]:
    rows = conn.execute("SELECT nextval('shop_order_ids') FROM generate_series(1, %s)", (n,)).fetchall()
    return [int(r[0]) for r in rows]


def seed_orders(dsn: str, n: int, *, amount: int = 4200) -> list[int]:
    """``n`` new 'pending' orders (version 0); returns their ids."""
    with untraced(dsn) as conn:
        ids = _next_ids(conn, n)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO orders (id, status, amount, version) VALUES (%s, 'pending', %s, 0)",
                [(i, amount) for i in ids],
            )
    return ids


def seed_skus(dsn: str, skus: list[str], *, stock: int = 1) -> list[str]:
    """Inventory rows for ``skus``, each with ``stock`` units; returns the skus."""
    with untraced(dsn) as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO inventory (sku, stock) VALUES (%s, %s)", [(s, stock) for s in skus])
    return skus
