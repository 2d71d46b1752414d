"""Debezium JSON change events (Kafka Connect ``JsonConverter``, schemas on or off) → ``RowChange``.

Row values are production data of any size: a column value longer than ``max_value_bytes`` (as JSON text) is
replaced by Debezium's own placeholder for a value it did not send (``__debezium_unavailable_value``, which every
comparison treats as unknown) and counted, so that one megabyte column costs neither the row change nor the internal
topic's message size; so is a value nested deeper than ``MAX_NESTING`` (no serializer downstream need follow it). A
key, table or transaction id that long refuses the message (a row cannot be named by it). The other forms Debezium
is run with (precise decimals, the unwrapped record, heartbeats, transaction metadata) are read as
:mod:`streamer.decode.debezium_forms` describes. A key or value in a schema registry's Avro framing (magic byte 0) is
read with :mod:`streamer.decode.avro` into the same documents the JSON converter writes, so that the envelope, the
unwrapped record, heartbeats and transaction events take one path whatever the converter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from processors.model.events import CdcOp, RowChange, Scalar
from processors.sql.values import UNAVAILABLE
from streamer.decode.avro import read
from streamer.decode.debezium_forms import HEARTBEAT_PREFIX, convert_row, converters, is_transaction_event, unwrapped
from streamer.decode.errors import DecodeError
from streamer.decode.jsontext import loads
from streamer.decode.schema_registry import SchemaRegistry

__all__ = ["ChangeStats", "decode_row_change"]

MAX_NESTING = 32  # objects and arrays in a row value (as for an OTLP attribute value)
_MISSING = "debezium_missing_field"
_INVALID = "debezium_invalid_field"
AVRO = "avro"  # the schema of an Avro document: typed by its registry schema, its decimals decoded already


def _load(data: bytes, what: str, registry: SchemaRegistry | None) -> tuple[Any, Any]:
    """Parse a message into (payload, schema): Avro in a registry's framing with ``AVRO`` as its schema (its decimals
    are decoded already); JSON with a ``{"schema": ..., "payload": ...}`` wrapper (``schemas.enable=true``) split,
    anything else with schema None."""
    if data[:1] == b"\x00":  # a registry's magic byte: never the first byte of JSON
        if registry is None:
            raise DecodeError("avro_no_registry", f"the {what} is Avro in a registry's framing and "
                              "decode.schema_registry.url is not set")  # fmt: skip
        schema, datum = registry.datum(data)
        return read(schema, datum), AVRO
    doc = loads(data, "debezium_invalid_json", what)
    if isinstance(doc, dict) and doc.keys() == {"schema", "payload"}:
        return doc["payload"], doc["schema"]
    return doc, None


def _scalar(value: Any) -> Scalar:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Decimal):
        return str(value)  # a key's precise decimal, with its scale
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)  # e.g. a struct


def _row(envelope: dict[str, Any], field: str) -> dict[str, Any] | None:
    row = envelope.get(field)
    if row is not None and not isinstance(row, dict):
        raise DecodeError(_INVALID, f"{field!r} is not an object")
    return row


def _over(value: Any, limit: int) -> bool:
    """Whether ``value`` as JSON text takes more than ``limit`` UTF-8 bytes (cheap for the short values most columns
    hold; numbers, booleans and null are a few bytes: an int's digits are bounded by json's int-string limit)."""
    if isinstance(value, str):
        return 4 * len(value) > limit and len(value.encode("utf-8", "surrogatepass")) > limit
    if isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False, default=str)  # (an Avro array's decimals as their text)
        return len(text.encode("utf-8", "surrogatepass")) > limit
    return False


def _deep(value: Any) -> bool:
    """Whether ``value`` nests objects and arrays deeper than ``MAX_NESTING`` (Debezium's values are scalars, small
    structs such as a variable-scale decimal, and arrays of at most PostgreSQL's 6 dimensions)."""
    level: list[Any] = [value]
    for _ in range(MAX_NESTING):
        level = [x for v in level for x in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())]
        if not level:
            return False
    return True


def _unusable(value: Any, limit: int, size: bool) -> bool:
    return (isinstance(value, dict | list) and _deep(value)) or (size and _over(value, limit))


def _bounded(row: dict[str, Any] | None, limit: int, size: bool) -> tuple[dict[str, Any] | None, int]:
    """``row`` with each value nested too deep, or (``size``) over ``limit`` bytes, replaced by ``UNAVAILABLE``; and
    how many were."""
    if row is None:
        return None, 0
    over = {column for column, value in row.items() if _unusable(value, limit, size)}
    if not over:
        return row, 0
    return {c: UNAVAILABLE if c in over else v for c, v in row.items()}, len(over)


def _text(value: Any, what: str, limit: int) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) > limit:
        raise DecodeError(_INVALID, f"{what} is {len(text)} characters long")
    return text


def _int(obj: dict[str, Any], field: str, where: str) -> int:
    value = obj.get(field)
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DecodeError(_INVALID, f"'{where}{field}' is not an integer: {value!r:.40}")


def _row_key(
    key: bytes | None,
    op: CdcOp,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    registry: SchemaRegistry | None,
) -> tuple[tuple[str, Scalar], ...]:
    """Primary key columns from the message key, else the row's ``id`` column."""
    doc, schema = _load(key, "message key", registry) if key else (None, None)
    if isinstance(doc, dict) and doc:
        doc, _ = convert_row(doc, converters(schema, None))
        assert doc is not None
        return tuple((str(column), _scalar(value)) for column, value in doc.items())
    if doc is not None and not isinstance(doc, dict):
        raise DecodeError(_INVALID, f"message key is not an object: {doc!r:.40}")
    row = after if after is not None else before
    if row is not None and "id" in row:
        return (("id", _scalar(row["id"])),)
    if op is CdcOp.TRUNCATE:
        return ()  # a truncate names no row
    raise DecodeError("debezium_missing_key", "no message key and no 'id' column in the row")


@dataclass(slots=True)
class ChangeStats:
    """What decoding row changes left out or saw: row values over ``max_value_bytes`` (or decimals too long);
    changes without a schema (a precise decimal's scale unknown); unwrapped changes (no before-image of an
    update); heartbeats and transaction BEGIN/END events (no row)."""

    oversize_values: int = 0
    schemaless: int = 0
    unwrapped: int = 0
    heartbeats: int = 0
    transactions: int = 0


def _tx_id(source: dict[str, Any], envelope: dict[str, Any]) -> Any:
    """``source.txId``; else the id of the change's ``transaction`` block (``provide.transaction.metadata``). The
    PostgreSQL connector's block id is ``<txId>:<lsn>`` with each event's own LSN, so it is no better a key than
    ``source.txId``, which it always sends."""
    tx_id = source.get("txId")
    block = envelope.get("transaction")
    if tx_id is None and isinstance(block, dict):
        return block.get("id")
    return tx_id


def decode_row_change(
    key: bytes | None,
    value: bytes | None,
    *,
    topic: str,
    partition: int,
    offset: int,
    max_value_bytes: int = 65_536,
    stats: ChangeStats | None = None,
    registry: SchemaRegistry | None = None,
) -> RowChange | None:
    """Decode one Debezium change event, JSON or (with ``registry``, which has fetched its schemas) Avro; a tombstone
    (null or empty value) gives None. A row value over ``max_value_bytes`` is replaced by ``UNAVAILABLE`` and counted
    in ``stats``; a key over it refuses the message."""
    if not value:
        return None
    stats = ChangeStats() if stats is None else stats
    envelope, value_schema = _load(value, "value", registry)
    if envelope is None:
        return None  # a null payload in a schema wrapper is a tombstone too
    if not isinstance(envelope, dict):
        raise DecodeError("debezium_invalid_json", "value is not an object")
    if topic.startswith(HEARTBEAT_PREFIX) or is_transaction_event(envelope):
        stats.heartbeats += topic.startswith(HEARTBEAT_PREFIX)
        stats.transactions += not topic.startswith(HEARTBEAT_PREFIX)
        return None
    flat = unwrapped(envelope, topic)
    if flat is not None:
        stats.unwrapped += 1
        envelope, row_field = flat, None
    else:
        row_field = "after"
    stats.schemaless += value_schema is None
    op = envelope.get("op")
    if op is None:
        raise DecodeError(_MISSING, f"missing field 'op' (topic {topic}; an unwrapped record needs add.fields=op)")
    try:
        cdc_op = CdcOp(op)
    except ValueError:
        raise DecodeError(_INVALID, f"unknown op {op!r:.20}") from None
    source = envelope.get("source")
    if source is None:
        raise DecodeError(_MISSING, "missing field 'source'")
    if not isinstance(source, dict):
        raise DecodeError(_INVALID, "'source' is not an object")
    table = source.get("table")
    if not table:
        raise DecodeError(_MISSING, "missing field 'source.table'")
    schema = source.get("schema") or source.get("db")  # MySQL has no schema, only db
    if not schema:
        raise DecodeError(_MISSING, "missing field 'source.schema'")
    before, after = _row(envelope, "before"), _row(envelope, "after")
    decimals = converters(value_schema, row_field)  # before and after share one row schema
    (before, n_before), (after, n_after) = convert_row(before, decimals), convert_row(after, decimals)
    stats.oversize_values += n_before + n_after
    row_key = _row_key(key, cdc_op, before, after, registry)
    if any(_over(c, max_value_bytes) or _over(v, max_value_bytes) for c, v in row_key):
        raise DecodeError("debezium_oversize_key", f"a key column or value is over {max_value_bytes} bytes")
    # A value's JSON text is no longer than a JSON message: only then can one be over (Avro's can be: base64, digits).
    size = value_schema is AVRO or len(value) > max_value_bytes
    (before, n_before), (after, n_after) = (
        _bounded(before, max_value_bytes, size),
        _bounded(after, max_value_bytes, size),
    )
    stats.oversize_values += n_before + n_after
    tx_id = _tx_id(source, envelope)
    return RowChange(
        table=_text(schema, "source.schema", max_value_bytes) + "." + _text(table, "source.table", max_value_bytes),
        op=cdc_op,
        key=row_key,
        before=before,
        after=after,
        commit_ts_ms=_int(source, "ts_ms", "source."),
        ts_ms=_int(envelope, "ts_ms", ""),
        lsn=_int(source, "lsn", "source."),
        tx_id="" if tx_id is None else _text(tx_id, "source.txId", max_value_bytes),
        topic=topic,
        partition=partition,
        offset=offset,
    )
