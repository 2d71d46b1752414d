"""Debezium JSON change events (Kafka Connect ``JsonConverter``, schemas on or off) → ``RowChange``."""

from __future__ import annotations

import json
from typing import Any

from processors.model.events import CdcOp, RowChange, Scalar
from streamer.decode.errors import DecodeError
from streamer.decode.jsontext import loads

__all__ = ["decode_row_change"]

_MISSING = "debezium_missing_field"
_INVALID = "debezium_invalid_field"


def _load(data: bytes, what: str) -> Any:
    """Parse JSON and drop a ``{"schema": ..., "payload": ...}`` wrapper (``schemas.enable=true``)."""
    doc = loads(data, "debezium_invalid_json", what)
    if isinstance(doc, dict) and doc.keys() == {"schema", "payload"}:
        return doc["payload"]
    return doc


def _scalar(value: Any) -> Scalar:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)  # e.g. a variable-scale decimal struct


def _row(envelope: dict[str, Any], field: str) -> dict[str, Any] | None:
    row = envelope.get(field)
    if row is not None and not isinstance(row, dict):
        raise DecodeError(_INVALID, f"{field!r} is not an object")
    return row


def _int(obj: dict[str, Any], field: str, where: str) -> int:
    value = obj.get(field)
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DecodeError(_INVALID, f"'{where}{field}' is not an integer: {value!r:.40}")


def _row_key(
    key: bytes | None, op: CdcOp, before: dict[str, Any] | None, after: dict[str, Any] | None
) -> tuple[tuple[str, Scalar], ...]:
    """Primary key columns from the message key, else the row's ``id`` column."""
    doc = _load(key, "message key") if key else None
    if isinstance(doc, dict) and doc:
        return tuple((str(column), _scalar(value)) for column, value in doc.items())
    if doc is not None and not isinstance(doc, dict):
        raise DecodeError(_INVALID, f"message key is not a JSON object: {doc!r:.40}")
    row = after if after is not None else before
    if row is not None and "id" in row:
        return (("id", _scalar(row["id"])),)
    if op is CdcOp.TRUNCATE:
        return ()  # a truncate names no row
    raise DecodeError("debezium_missing_key", "no message key and no 'id' column in the row")


def decode_row_change(
    key: bytes | None, value: bytes | None, *, topic: str, partition: int, offset: int
) -> RowChange | None:
    """Decode one Debezium change event; a tombstone (null or empty value) gives None."""
    if not value:
        return None
    envelope = _load(value, "value")
    if envelope is None:
        return None  # a null payload in a schema wrapper is a tombstone too
    if not isinstance(envelope, dict):
        raise DecodeError("debezium_invalid_json", "value is not a JSON object")
    op = envelope.get("op")
    if op is None:
        raise DecodeError(_MISSING, f"missing field 'op' (topic {topic})")
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
    tx_id = source.get("txId")
    return RowChange(
        table=f"{schema}.{table}",
        op=cdc_op,
        key=_row_key(key, cdc_op, before, after),
        before=before,
        after=after,
        commit_ts_ms=_int(source, "ts_ms", "source."),
        ts_ms=_int(envelope, "ts_ms", ""),
        lsn=_int(source, "lsn", "source."),
        tx_id="" if tx_id is None else str(tx_id),
        topic=topic,
        partition=partition,
        offset=offset,
    )
