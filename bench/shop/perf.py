"""Three performance defects of the cart (the default path) and their fixes (``clean=True``), as the handlers are.

The client sends its cart (skus). Nothing here is a concurrency defect: one request at a time shows each.

cart_summary (``POST /cart/summary``) — N+1 queries. Buggy: ``SELECT stock FROM inventory WHERE sku = %s`` once
    per item of the cart, one after the other. Clean: ``SELECT sku, stock FROM inventory WHERE sku = ANY(%s)``,
    one statement for the whole cart.

shipping_quote (``POST /cart/shipping-quote``) — serialized fan-out. One ``SELECT ... = ANY(%s)`` for the cart,
    then the carrier's rate API (``POST /rates``, ``RATE_S`` each) once per parcel. Buggy: one call after the
    other. Clean: all the calls at once (a thread pool, the request's context carried into each thread).

cart_tax (``POST /cart/tax``) — retry storm. The tax service (``POST /tax/quote``) restarts now and then: it
    answers 503 for ``OUTAGE_S`` (the traffic restarts it as every second request comes). Buggy: the client tries
    again at once, up to ``ATTEMPTS`` times; every attempt lands inside the outage and the request fails (503).
    Clean: one retry after a jittered backoff longer than the outage, which succeeds.
"""

from __future__ import annotations

import contextvars
import random
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from bench.shop.downstream import HttpClient, Outage
from bench.shop.errors import DependencyUnavailable, NotFound

ITEM_STOCK = "SELECT stock FROM inventory WHERE sku = %s"
CART_STOCK = "SELECT sku, stock FROM inventory WHERE sku = ANY(%s)"
RATE_S = 0.02  # the carrier's rate API, per parcel
TAX_S = 0.002  # the tax service's answer (a 503 comes as fast)
OUTAGE_S = 0.2  # how long the tax service is down when a cart_tax request comes
ATTEMPTS = 4  # the buggy client's attempts, one right after the other
BACKOFF_S = (0.25, 0.3)  # the clean client's wait before its one retry: jittered, longer than the outage


def _stock(conn: psycopg.Connection, skus: list[str], *, clean: bool) -> dict[str, int]:
    with conn.cursor() as cur:
        if clean:
            stock = {str(sku): int(n) for sku, n in cur.execute(CART_STOCK, (skus,)).fetchall()}
        else:
            stock = {}
            for sku in skus:  # one query per item
                row = cur.execute(ITEM_STOCK, (sku,)).fetchone()
                if row is not None:
                    stock[sku] = int(row[0])
    missing = [s for s in skus if s not in stock]
    if missing:
        raise NotFound(f"skus {', '.join(missing)} not found")
    return stock


def cart_summary(conn: psycopg.Connection, skus: list[str], *, clean: bool = False) -> dict[str, Any]:
    stock = _stock(conn, skus, clean=clean)
    return {"items": len(skus), "in_stock": sum(1 for n in stock.values() if n > 0)}


def shipping_quote(conn: psycopg.Connection, skus: list[str], carrier: HttpClient, *,
                   clean: bool = False) -> dict[str, Any]:  # fmt: skip
    _stock(conn, skus, clean=True)

    def rate(_: str) -> int:
        return carrier.call("POST", "/rates", lambda: 200, RATE_S)

    if clean:
        with ThreadPoolExecutor(max_workers=len(skus), thread_name_prefix="shop-rates") as pool:
            calls = [pool.submit(contextvars.copy_context().run, rate, sku) for sku in skus]  # the request's context
            statuses = [c.result() for c in calls]
    else:
        statuses = [rate(sku) for sku in skus]  # one parcel after the other
    return {"parcels": len(skus), "quoted": sum(1 for s in statuses if s == 200)}


def cart_tax(conn: psycopg.Connection, skus: list[str], tax: HttpClient, outage: Outage, *,
             clean: bool = False) -> dict[str, Any]:  # fmt: skip
    _stock(conn, skus, clean=True)
    attempts = 2 if clean else ATTEMPTS
    for attempt in range(attempts):
        if attempt and clean:
            time.sleep(random.uniform(*BACKOFF_S))
        if tax.call("POST", "/tax/quote", outage.answer, TAX_S) < 500:
            return {"items": len(skus), "attempts": attempt + 1}
    raise DependencyUnavailable(f"tax service unavailable after {attempts} attempts")
