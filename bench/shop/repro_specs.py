"""How the repro compiler calls the shop's handlers and jobs from a recorded incident (application-level repros).

Per recorded function (``code.function.name``): its import path, and where each argument comes from. Statement
numbers count the function's statements on the incident's entity, in order. The generated test calls the
function with a psycopg connection (autocommit, as ``service.Shop`` gives it) and ``clean=False``, the code path
that was recorded.
"""

from __future__ import annotations

from pathlib import Path

from processors.repro.app_level import CallSpec, Const, Format, Param, PerSession

SCHEMA_SQL = Path(__file__).with_name("schema.sql").read_text(encoding="utf-8")
BUGGY = (("clean", Const(False)),)

CALL_SPECS: dict[str, CallSpec] = {
    # capture_payment(conn, order_id, idempotency_key): READ_ORDER's parameter is the order id.
    "shop.handlers.capture_payment": CallSpec(
        "bench.shop.handlers:capture_payment", (Param(0, 0), Format("cap-{}", (Param(0, 0),))), BUGGY
    ),
    # expire_cart(conn, order_id)
    "shop.jobs.expire_cart": CallSpec("bench.shop.jobs:expire_cart", (Param(0, 0),), BUGGY),
    # checkout(conn, sku, order_id, amount): the sku is the stock read's parameter; the order it creates needs an
    # id of its own per session (the INSERT INTO orders is not on the inventory row, so it is not recorded there).
    "shop.handlers.checkout": CallSpec(
        "bench.shop.handlers:checkout", (Param(0, 0), PerSession(9_000_000), Const(4200)), BUGGY
    ),
    # charge(conn, order_id, amount, idempotency_key): both from the INSERT; the retry reuses the client's key.
    "shop.handlers.charge": CallSpec(
        "bench.shop.handlers:charge", (Param(0, 0), Param(0, 1), Format("pay-{}", (Param(0, 0),))), BUGGY
    ),
}
