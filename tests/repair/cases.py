"""The sample shop's statements and code paths as its spans record them, and incidents built from them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.sql import SqlAccessExtractor

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("golden")

# The shop's statements, exactly as its psycopg spans record them (see bench/shop/handlers.py).
READ_ORDER = "SELECT status, version, amount FROM orders WHERE id = %s"
READ_ORDER_LOCKED = READ_ORDER + " FOR UPDATE"
SET_STATUS = "UPDATE orders SET status = %s, version = version + 1 WHERE id = %s RETURNING version"
READ_STOCK = "SELECT stock FROM inventory WHERE sku = %s"
TAKE_UNIT = "UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock"
NEW_ORDER = "INSERT INTO orders (id, status, amount) VALUES (%s, %s, %s)"
FIND_CHARGE = "SELECT id FROM charges WHERE order_id = %s"
INSERT_CHARGE = "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id"

CAPTURE = "shop.handlers.capture_payment"
EXPIRE = "shop.jobs.expire_cart"
CHECKOUT = "shop.handlers.checkout"
CHARGE = "shop.handlers.charge"
INVARIANTS = {"inventory": ["stock >= 0"]}


def daemon_extractor() -> SqlAccessExtractor:
    """The extractor as config/trace-repro.toml configures the daemon's."""
    return SqlAccessExtractor(key_columns={"inventory": ["sku"]}, insert_identity={"charges": ["order_id"]})


Access = Callable[..., AccessInfo]


def incident(anomaly: str, table: str, entity: str, culprit: AccessInfo, victim: AccessInfo,
             accesses: list[AccessInfo], **kwargs: Any) -> IncidentEvent:  # fmt: skip
    """An incident as ``processors.detectors.collisions.incident.incident_event`` publishes it."""
    writers = [a for a in accesses if a.operation != "read"]
    return IncidentEvent(
        fingerprint="f" * 16,
        occurrence="o" * 16,
        anomaly=anomaly,
        severity="high",
        manifest=True,
        entity=entity,
        table=table,
        window_ms=12.5,
        summary=f"{anomaly} on {entity}",
        damage="",
        confidence=0.9,
        culprit=culprit,
        victim=victim,
        writers=writers,
        accesses=accesses,
        commits=[],
        evidence=[],
        detected_at_unix_ms=1_800_000_001_000,
        **kwargs,
    )
