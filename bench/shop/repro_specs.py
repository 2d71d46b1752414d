"""Hand-written call specs for the shop's handlers and jobs: an example of the ``[repro] call_specs`` override.

The demo does not use them (the repro worker derives the same calls from the spans and the source,
:mod:`processors.repro.derive`); tests use them to compile application-level repros without a source checkout.

Per recorded function (``code.function.name``): its import path, and where each argument comes from. Statement
numbers count the function's statements on the incident's entity, in order. The generated test calls the
function with a psycopg connection (autocommit, as ``service.Shop`` gives it) and ``clean=False``, the code path
that was recorded.
"""

from __future__ import annotations

from pathlib import Path

from processors.repro.app_level import CallSpec, Const, Format, Param

SCHEMA_SQL = Path(__file__).with_name("schema.sql").read_text(encoding="utf-8")
BUGGY = (("clean", Const(False)),)

CALL_SPECS: dict[str, CallSpec] = {
    # capture_payment(conn, order_id, idempotency_key): READ_ORDER's parameter is the order id.
    "shop.handlers.capture_payment": CallSpec(
        "bench.shop.handlers:capture_payment", (Param(0, 0), Format("cap-{}", (Param(0, 0),))), BUGGY
    ),
    # expire_cart(conn, order_id)
    "shop.jobs.expire_cart": CallSpec("bench.shop.jobs:expire_cart", (Param(0, 0),), BUGGY),
    # checkout(conn, sku): the sku is the stock read's parameter (the order's id and price are the shop's own).
    "shop.handlers.checkout": CallSpec("bench.shop.handlers:checkout", (Param(0, 0),), BUGGY),
    # charge(conn, order_id, amount, idempotency_key): both from the INSERT; the retry reuses the client's key.
    "shop.handlers.charge": CallSpec(
        "bench.shop.handlers:charge", (Param(0, 0), Param(0, 1), Format("pay-{}", (Param(0, 0),))), BUGGY
    ),
}
