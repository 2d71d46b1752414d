"""In-process stand-ins for the shop's two downstream systems, called after the database transaction commits."""

from __future__ import annotations

import threading

from bench.shop.errors import IdempotencyKeyReused, Oversold


class PaymentProvider:
    """A card processor's capture API with idempotency keys: replaying a key for the same charge returns the
    first result; using a key for a different charge is refused (as card processors answer a key reused with
    different parameters)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._captures: dict[str, int] = {}

    def capture(self, idempotency_key: str, charge_id: int, amount: int) -> str:
        with self._lock:
            first = self._captures.setdefault(idempotency_key, charge_id)
        if first != charge_id:
            raise IdempotencyKeyReused(
                f"idempotency key {idempotency_key!r} already captured charge {first}; refused charge {charge_id}"
            )
        return f"cap_{idempotency_key}_{amount}"


PROVIDER = PaymentProvider()


def allocate(sku: str, remaining: int) -> None:
    """Warehouse allocation of the unit just sold; there is none when the counter went below zero."""
    if remaining < 0:
        raise Oversold(f"sku {sku} oversold: no unit left to allocate (stock is now {remaining})")
