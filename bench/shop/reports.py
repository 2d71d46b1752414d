"""Reports: a query with no timeout (the hang defect) and its fix (``clean=True``).

sales_report (``GET /reports/orders``) sums the orders of a status. Its query usually answers in a few
milliseconds; when the database stalls (a bad plan, a lock, a busy replica: ``stalled`` stands for it, the query
waits ``pg_sleep`` of the stall) it answers only when the database does. The sleep sits in the select list of the
aggregate (one output row, so it runs exactly once whatever the plan): joined in ``FROM`` it was never run once the
planner scanned an analyzed, empty ``orders`` first, and the stall silently vanished.
    Buggy (v1.0.0): the query runs with no ``statement_timeout``: a stalled database holds the request, its
    connection and the caller for the whole stall, and the request then answers 200 as if nothing happened.
    Clean (v1.1.0): ``SET LOCAL statement_timeout`` first; a stalled query is cancelled by PostgreSQL after
    ``TIMEOUT_MS`` and the request fails fast with ``UpstreamTimeout`` (504).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.shop.errors import UpstreamTimeout

ROUTE = "/reports/orders"
STALL_S = 6.0  # how long a stalled database takes to answer the report's query
TIMEOUT_MS = 1_000  # the fix's statement timeout
SET_TIMEOUT = "SET LOCAL statement_timeout = 1000"  # TIMEOUT_MS
REPORT = "SELECT count(*), coalesce(sum(amount), 0), pg_sleep(%s) FROM orders WHERE status = %s"
_stall_s = 0.0  # the database's current stall (set by ``stalled``: the environment, not the shop's code)


@contextmanager
def stalled(seconds: float) -> Iterator[None]:
    """While inside, the report's query takes ``seconds`` more (the database stalls)."""
    global _stall_s
    _stall_s = seconds
    try:
        yield
    finally:
        _stall_s = 0.0


def sales_report(conn: psycopg.Connection, status: str, *, clean: bool = False) -> dict[str, Any]:
    with conn.transaction(), conn.cursor() as cur:
        if clean:
            cur.execute(SET_TIMEOUT)
        try:
            row = cur.execute(REPORT, (_stall_s, status)).fetchone()
        except psycopg.errors.QueryCanceled as exc:
            raise UpstreamTimeout(f"the orders report took more than {TIMEOUT_MS} ms: {exc}") from exc
    count, total, _ = row if row is not None else (0, 0, None)
    return {"status": status, "orders": int(count), "amount": int(total)}
