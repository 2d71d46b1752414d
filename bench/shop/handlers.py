"""Request handlers: three real concurrency defects (the default path) and their fixes (``clean=True``).

The fixes sit behind a keyword flag, as a feature flag would: v1.0.0 calls the handlers without it (the buggy
path), v1.1.0 turns it on (``service.Shop``). A call with the recorded arguments alone (an application-level repro's
derived call spec) therefore runs the path production ran.

Each handler runs one transaction on the connection it is given (autocommit connection, explicit
``conn.transaction()``: BEGIN and COMMIT are not statements, so not spans) and calls ``race_point()`` right
before its conflicting step. Steps after the commit run against downstream systems (``payments``).

capture_payment (``POST /orders/{order_id}/capture``) races the ``jobs.expire_cart`` job — lost update.
    Buggy: ``SELECT status, version, amount FROM orders WHERE id = %s`` (no lock) → 'pending' → race point (the
    card is being authorised) → record the charge → ``UPDATE orders SET status = %s, version = version + 1
    WHERE id = %s RETURNING version`` → commit. ``expire_cart`` does the same read and the same unconditional
    UPDATE to 'cancelled'. Both read 'pending', both write; the UPDATE that comes second waits for the first
    one's row lock and then overwrites its status. Capture records its charge first, so the job usually wins
    the row and capture overwrites 'cancelled' with 'paid' (a lost cancellation); otherwise the job overwrites
    'paid' with 'cancelled' (a lost payment: a charge for a cancelled order). Both writers run a post-commit
    audit (``audit_transition``): the one whose UPDATE returned a version other than the read version + 1
    knows it clobbered a concurrent change and fails with ``OrderChangedConcurrently`` (500) — after commit,
    so the clobber stays. Row changes: two ``u`` events on ``orders``; the second's ``before`` is the first's
    ``after`` ('cancelled' v1 → 'paid' v2); the final row has version 2 though each writer read version 0.
    Clean: ``race_point()`` then ``SELECT ... FOR UPDATE``; the loser waits for the lock, reads the new status
    and stops (capture answers 409, the job skips): one ``u`` event, version 1.

checkout (``POST /checkout``, the client sends the sku) — inventory oversell. The order's id comes from the
    shop's sequence and its amount is the shop's price (``UNIT_PRICE``), not the client's.
    Buggy: ``SELECT stock FROM inventory WHERE sku = %s`` → ≥ 1 → race point → ``UPDATE inventory SET stock =
    stock - 1 WHERE sku = %s RETURNING stock`` (no guard) → ``INSERT INTO orders`` → commit → warehouse
    allocation. Two checkouts of the last unit both pass the check and both decrement: stock ends at -1 (the
    ``stock >= 0`` invariant broken in the Debezium after-image) and the second request fails in allocation
    with ``Oversold`` (500). Clean: ``... WHERE sku = %s AND stock >= 1 RETURNING stock``; no row → 409.

charge (``POST /orders/{order_id}/charges``, a client retry racing the original) — double charge.
    Buggy: ``SELECT id FROM charges WHERE order_id = %s`` → none → race point → ``INSERT INTO charges
    (order_id, amount) VALUES (%s, %s) RETURNING id`` → commit → provider capture with the idempotency key.
    Both requests insert (two ``c`` events on ``charges`` for one order); the provider refuses the second
    charge id under the same key: ``IdempotencyKeyReused`` (500). Clean: race point → ``INSERT ... (order_id,
    amount, idempotency_key) ... ON CONFLICT (idempotency_key) DO NOTHING RETURNING id``, else the existing id.
"""

from __future__ import annotations

from typing import Any

import psycopg

from bench.shop.errors import NotFound, OrderChangedConcurrently, OrderNotPayable, OutOfStock
from bench.shop.payments import PROVIDER, allocate
from bench.shop.race import race_point

READ_ORDER = "SELECT status, version, amount FROM orders WHERE id = %s"
TAKE_UNIT = "UPDATE inventory SET stock = stock - 1 WHERE sku = %s"
SET_STATUS = "UPDATE orders SET status = %s, version = version + 1 WHERE id = %s RETURNING version"
UNIT_PRICE = 4200  # what checkout charges for a unit (cents): the shop prices it, the client does not


def audit_transition(order_id: int, read_version: int, written_version: int) -> None:
    """Post-commit audit: exactly one transition from the version we read, else someone else wrote too."""
    if written_version != read_version + 1:
        raise OrderChangedConcurrently(
            f"order {order_id} changed concurrently: read version {read_version}, wrote version {written_version}"
        )


def one_row(row: Any, what: str) -> Any:
    if row is None:
        raise NotFound(f"{what} not found")
    return row


def _record_charge(cur: psycopg.Cursor[Any], order_id: int, amount: int, key: str, *, clean: bool,
                   race: bool) -> int:  # fmt: skip
    if clean:
        if race:
            race_point()
        row = cur.execute(
            "INSERT INTO charges (order_id, amount, idempotency_key) VALUES (%s, %s, %s)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            (order_id, amount, key),
        ).fetchone()
        if row is None:  # the same key was charged first: answer with that charge
            row = cur.execute("SELECT id FROM charges WHERE idempotency_key = %s", (key,)).fetchone()
        return int(one_row(row, f"charge {key}")[0])
    row = cur.execute("SELECT id FROM charges WHERE order_id = %s", (order_id,)).fetchone()
    if row is not None:
        return int(row[0])
    if race:
        race_point()
    row = cur.execute("INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id", (order_id, amount))
    return int(one_row(row.fetchone(), "inserted charge")[0])


def capture_payment(conn: psycopg.Connection, order_id: int, idempotency_key: str, *,
                    clean: bool = False) -> dict[str, Any]:  # fmt: skip
    with conn.transaction(), conn.cursor() as cur:
        if clean:
            race_point()
            row = cur.execute(READ_ORDER + " FOR UPDATE", (order_id,)).fetchone()
        else:
            row = cur.execute(READ_ORDER, (order_id,)).fetchone()
        status, version, amount = one_row(row, f"order {order_id}")
        if status != "pending":
            raise OrderNotPayable(f"order {order_id} is {status}")
        if not clean:
            race_point()  # the card is being authorised
        charge_id = _record_charge(cur, order_id, amount, idempotency_key, clean=clean, race=False)
        (written,) = one_row(cur.execute(SET_STATUS, ("paid", order_id)).fetchone(), f"order {order_id}")
    audit_transition(order_id, version, written)
    return {"order_id": order_id, "status": "paid", "charge_id": charge_id}


def checkout(conn: psycopg.Connection, sku: str, *, clean: bool = False) -> dict[str, Any]:
    with conn.transaction(), conn.cursor() as cur:
        (order_id,) = one_row(cur.execute("SELECT nextval(%s)", ("shop_order_ids",)).fetchone(), "order id")
        (stock,) = one_row(cur.execute("SELECT stock FROM inventory WHERE sku = %s", (sku,)).fetchone(), f"sku {sku}")
        if stock < 1:
            raise OutOfStock(f"sku {sku} is out of stock")
        race_point()
        guard = " AND stock >= 1" if clean else ""
        row = cur.execute(TAKE_UNIT + guard + " RETURNING stock", (sku,)).fetchone()
        if row is None and clean:
            raise OutOfStock(f"sku {sku} sold out meanwhile")
        (remaining,) = one_row(row, f"sku {sku}")
        cur.execute("INSERT INTO orders (id, status, amount) VALUES (%s, %s, %s)", (order_id, "pending", UNIT_PRICE))
    allocate(sku, remaining)
    return {"order_id": order_id, "sku": sku, "stock": remaining}


def charge(conn: psycopg.Connection, order_id: int, amount: int, idempotency_key: str, *,
           clean: bool = False) -> dict[str, Any]:  # fmt: skip
    with conn.transaction(), conn.cursor() as cur:
        charge_id = _record_charge(cur, order_id, amount, idempotency_key, clean=clean, race=True)
    capture = PROVIDER.capture(idempotency_key, charge_id, amount)
    return {"order_id": order_id, "charge_id": charge_id, "capture": capture}
