"""The Debezium forms beside the full JSON envelope: precise decimals, the unwrapped record, heartbeats, transactions.

* **Precise decimals** (``decimal.handling.mode=precise``, Debezium's default): a ``NUMERIC(p, s)`` column arrives as
  the base64 text of its unscaled big-endian two's-complement integer, its scale only in the message's schema
  (``schemas.enable=true``: type ``bytes``, name ``org.apache.kafka.connect.data.Decimal``, parameter ``scale``); a
  ``NUMERIC`` without scale as ``io.debezium.data.VariableScaleDecimal``, a struct ``{scale, value}`` that carries its
  own scale. Both become :class:`decimal.Decimal` with that scale (``12.50`` stays ``12.50``). Without a schema the
  scale of a ``bytes`` decimal is nowhere: its base64 text is kept as it came (it compares with no number: unknown,
  never a wrong answer) and the change is counted as schemaless; a variable-scale struct still decodes.
* **The unwrapped record** (``io.debezium.transforms.ExtractNewRecordState``): the row itself, with the source
  fields ``add.fields`` names as ``__op``, ``__table``, ``__lsn``, ``__source_ts_ms``... and ``__deleted``
  (``delete.tombstone.handling.mode=rewrite``). It has no before-image of an update (a delete's row is its
  before-image): what needs one (a lost update seen as a value overwritten) cannot be judged from it. Without
  ``__op`` (nor ``__deleted=true``) an insert and an update cannot be told apart: the message is refused with the
  option to set, not guessed.
* **Heartbeats** (``__debezium-heartbeat.<prefix>``) and **transaction metadata** (``<prefix>.transaction``, BEGIN
  and END with per-table counts) carry no row: recognised, counted, and not dead-lettered when a pattern subscribes
  them.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from processors.sql.values import UNAVAILABLE
from streamer.decode.errors import DecodeError

__all__ = [
    "HEARTBEAT_PREFIX",
    "MAX_DECIMAL_TEXT",
    "Converters",
    "convert_row",
    "converters",
    "is_transaction_event",
    "unwrapped",
]

HEARTBEAT_PREFIX = "__debezium-heartbeat."
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE = "io.debezium.data.VariableScaleDecimal"
_MAX_SCALE = 1000  # PostgreSQL's NUMERIC keeps at most 16383 digits after the point; past this a scale is hostile
_INVALID = "debezium_invalid_decimal"
MAX_DECIMAL_TEXT = 2048  # base64 chars (1536 bytes, under 3700 digits): a longer decimal is kept as UNAVAILABLE,
# within Python's 4300-digit limit of int <-> text and far past what a NUMERIC column of a business table holds

Converters = Mapping[str, int | None]  # column -> scale of a bytes decimal, None for a variable-scale struct


def converters(schema: Any, field: str | None) -> Converters:
    """The decimal columns a Connect schema declares: of its ``field`` struct (``before``/``after`` of an envelope),
    or of the schema itself (``field`` None: a key or an unwrapped row)."""
    if not isinstance(schema, dict):
        return {}
    if field is not None:
        schema = next((f for f in _fields(schema) if f.get("field") == field), None)
        if schema is None:
            return {}
    out: dict[str, int | None] = {}
    for f in _fields(schema):
        name, column = f.get("name"), f.get("field")
        if not isinstance(column, str):
            continue
        if name == _VARIABLE:
            out[column] = None
        elif name == _DECIMAL:
            params = f.get("parameters")
            scale = params.get("scale") if isinstance(params, dict) else None
            out[column] = _scale(int(scale) if isinstance(scale, str) and scale.lstrip("-").isdigit() else None)
    return out


def _fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    fields = schema.get("fields")
    return [f for f in fields if isinstance(f, dict)] if isinstance(fields, list) else []


def _scale(scale: Any) -> int:
    if not isinstance(scale, int) or isinstance(scale, bool) or abs(scale) > _MAX_SCALE:
        raise DecodeError(_INVALID, f"decimal scale {scale!r:.20} is not an integer of at most {_MAX_SCALE}")
    return scale


def decimal_of(text: Any, scale: int) -> Decimal | None:
    """The decimal whose unscaled value is the base64 two's-complement big-endian integer ``text``; None when its text
    is over ``MAX_DECIMAL_TEXT``."""
    if not isinstance(text, str):
        raise DecodeError(_INVALID, f"a decimal's value is not base64 text: {text!r:.40}")
    if len(text) > MAX_DECIMAL_TEXT:
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise DecodeError(_INVALID, f"a decimal's value is not base64: {text!r:.40}") from None
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _number(value: Any, scale: int | None) -> Decimal | str | None:
    """``value`` as a decimal of ``scale`` (None: a variable-scale struct); ``UNAVAILABLE`` when too long; None when
    it is not a decimal at all (no scale and not a struct)."""
    if scale is not None:
        number = decimal_of(value, scale)
    elif isinstance(value, dict) and value.keys() == {"scale", "value"}:
        number = decimal_of(value["value"], _scale(value["scale"]))
    else:
        return None
    return UNAVAILABLE if number is None else number


def convert_row(row: dict[str, Any] | None, decimals: Converters) -> tuple[dict[str, Any] | None, int]:
    """``row`` with its declared decimal columns, and any variable-scale decimal struct (self-describing: decoded with
    or without a schema), as ``Decimal``; and how many were over ``MAX_DECIMAL_TEXT`` (now ``UNAVAILABLE``)."""
    if row is None:
        return None, 0
    out: dict[str, Any] | None = None
    over = 0
    for column, value in row.items():
        if value is None or value == UNAVAILABLE or not (column in decimals or isinstance(value, dict)):
            continue
        number = _number(value, decimals.get(column))
        if number is not None:
            out = dict(row) if out is None else out
            out[column] = number
            over += number is UNAVAILABLE
    return (row if out is None else out), over


def is_transaction_event(doc: dict[str, Any]) -> bool:
    """Whether ``doc`` is a BEGIN or END event of the transaction-metadata topic."""
    return "op" not in doc and doc.get("status") in ("BEGIN", "END") and "id" in doc


def _flag(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def unwrapped(doc: dict[str, Any], topic: str) -> dict[str, Any] | None:
    """An ``ExtractNewRecordState`` record as the envelope fields the decoder reads (op, source, before, after);
    None when ``doc`` is not one (it has ``op`` or ``source``, or no ``__`` field: a bare row is not told from
    anything else)."""
    if "op" in doc or "source" in doc or not any(isinstance(c, str) and c.startswith("__") for c in doc):
        return None
    deleted = _flag(doc.get("__deleted"))
    op = doc.get("__op", "d" if deleted else None)
    if op is None:
        raise DecodeError("debezium_unwrapped_no_op", "an unwrapped record without '__op' cannot tell an insert "
                          "from an update: set transforms.<unwrap>.add.fields=op")  # fmt: skip
    parts = topic.split(".")
    source = {
        "schema": doc.get("__schema") or doc.get("__db") or (parts[-2] if len(parts) >= 3 else None),
        "table": doc.get("__table") or (parts[-1] if len(parts) >= 3 else None),
        "ts_ms": doc.get("__source_ts_ms"),
        "lsn": doc.get("__lsn", doc.get("__source_lsn")),
        "txId": doc.get("__source_txId", doc.get("__txId")),
    }
    row = {c: v for c, v in doc.items() if not c.startswith("__")}
    before, after = (row, None) if op == "d" else (None, row)
    return {"op": op, "source": source, "before": before, "after": after, "ts_ms": doc.get("__ts_ms")}
