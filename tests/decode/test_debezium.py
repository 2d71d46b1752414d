"""Debezium change events (PostgreSQL connector, JsonConverter with and without schemas) → RowChange."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.model.events import CdcOp, RowChange
from streamer.decode import DecodeError, decode_row_change

TOPIC = "shop.public.orders"

# What Debezium 3.x's PostgreSQL connector writes for `UPDATE orders SET status = 'paid', version = 4 WHERE id = 8812`
# on a table with REPLICA IDENTITY FULL, through Kafka Connect's JsonConverter with schemas.enable=true.
_ROW_FIELDS = [
    {"type": "int64", "optional": False, "default": 0, "field": "id"},
    {"type": "string", "optional": False, "field": "status"},
    {"type": "int32", "optional": False, "field": "version"},
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.time.ZonedTimestamp",
        "version": 1,
        "field": "updated_at",
    },
]
_SOURCE_FIELDS = [
    {"type": "string", "optional": False, "field": "version"},
    {"type": "string", "optional": False, "field": "connector"},
    {"type": "string", "optional": False, "field": "name"},
    {"type": "int64", "optional": False, "field": "ts_ms"},
    {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"},
        "default": "false",
        "field": "snapshot",
    },
    {"type": "string", "optional": False, "field": "db"},
    {"type": "string", "optional": True, "field": "sequence"},
    {"type": "int64", "optional": True, "field": "ts_us"},
    {"type": "int64", "optional": True, "field": "ts_ns"},
    {"type": "string", "optional": False, "field": "schema"},
    {"type": "string", "optional": False, "field": "table"},
    {"type": "int64", "optional": True, "field": "txId"},
    {"type": "int64", "optional": True, "field": "lsn"},
    {"type": "int64", "optional": True, "field": "xmin"},
]
_ROW_STRUCT = {"type": "struct", "fields": _ROW_FIELDS, "optional": True, "name": "shop.public.orders.Value"}
VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "shop.public.orders.Value",
            "field": "before",
        },
        {
            "type": "struct",
            "fields": _ROW_FIELDS,
            "optional": True,
            "name": "shop.public.orders.Value",
            "field": "after",
        },
        {
            "type": "struct",
            "fields": _SOURCE_FIELDS,
            "optional": False,
            "name": "io.debezium.connector.postgresql.Source",
            "version": 1,
            "field": "source",
        },
        {
            "type": "struct",
            "fields": [
                {"type": "string", "optional": False, "field": "id"},
                {"type": "int64", "optional": False, "field": "total_order"},
                {"type": "int64", "optional": False, "field": "data_collection_order"},
            ],
            "optional": True,
            "name": "event.block",
            "version": 1,
            "field": "transaction",
        },
        {"type": "string", "optional": False, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
        {"type": "int64", "optional": True, "field": "ts_us"},
        {"type": "int64", "optional": True, "field": "ts_ns"},
    ],
    "optional": False,
    "name": "shop.public.orders.Envelope",
    "version": 2,
}
KEY_SCHEMA = {
    "type": "struct",
    "fields": [{"type": "int64", "optional": False, "default": 0, "field": "id"}],
    "optional": False,
    "name": "shop.public.orders.Key",
}
BEFORE = {"id": 8812, "status": "pending", "version": 3, "updated_at": "2025-11-29T10:15:02.118204Z"}
AFTER = {"id": 8812, "status": "paid", "version": 4, "updated_at": "2025-11-29T10:15:03.402771Z"}
UPDATE_PAYLOAD = {
    "before": BEFORE,
    "after": AFTER,
    "source": {
        "version": "3.1.2.Final",
        "connector": "postgresql",
        "name": "shop",
        "ts_ms": 1764411303402,
        "snapshot": "false",
        "db": "shop",
        "sequence": '["24023120","24023928"]',
        "ts_us": 1764411303402771,
        "ts_ns": 1764411303402771000,
        "schema": "public",
        "table": "orders",
        "txId": 771,
        "lsn": 24023928,
        "xmin": None,
    },
    "transaction": None,
    "op": "u",
    "ts_ms": 1764411303577,
    "ts_us": 1764411303577123,
    "ts_ns": 1764411303577123456,
}


def _wrapped(payload: Any, schema: Any) -> bytes:
    return json.dumps({"schema": schema, "payload": payload}).encode()


def _plain(payload: Any) -> bytes:
    return json.dumps(payload).encode()


def _event(op: str, before: Any, after: Any, **source: Any) -> dict[str, Any]:
    return {
        **UPDATE_PAYLOAD,
        "op": op,
        "before": before,
        "after": after,
        "source": {**UPDATE_PAYLOAD["source"], **source},
    }


def _decode(key: bytes | None, value: bytes | None) -> RowChange | None:
    return decode_row_change(key, value, topic=TOPIC, partition=3, offset=1207)


def test_update_with_schemas() -> None:
    """An update wrapped in schema/payload (key too) decodes every RowChange field."""
    change = _decode(_wrapped({"id": 8812}, KEY_SCHEMA), _wrapped(UPDATE_PAYLOAD, VALUE_SCHEMA))
    assert change == RowChange(
        table="public.orders",
        op=CdcOp.UPDATE,
        key=(("id", 8812),),
        before=BEFORE,
        after=AFTER,
        commit_ts_ms=1764411303402,
        ts_ms=1764411303577,
        lsn=24023928,
        tx_id="771",
        topic=TOPIC,
        partition=3,
        offset=1207,
    )
    assert change.entity_key == "orders:8812"


def test_without_schemas_same_result() -> None:
    """schemas.enable=false (no wrapper on key or value) gives the same RowChange."""
    wrapped = _decode(_wrapped({"id": 8812}, KEY_SCHEMA), _wrapped(UPDATE_PAYLOAD, VALUE_SCHEMA))
    assert _decode(_plain({"id": 8812}), _plain(UPDATE_PAYLOAD)) == wrapped


@pytest.mark.parametrize(
    ("op", "before", "after"),
    [
        ("c", None, AFTER),
        ("r", None, AFTER),  # snapshot read
        ("u", None, AFTER),  # REPLICA IDENTITY DEFAULT: no before image on update
        ("d", {"id": 8812, "status": "", "version": 0, "updated_at": None}, None),
    ],
)
def test_ops(op: str, before: Any, after: Any) -> None:
    """Create, snapshot read, update and delete events keep their op and row images."""
    change = _decode(_plain({"id": 8812}), _plain(_event(op, before, after)))
    assert change is not None
    assert (change.op, change.before, change.after, change.key) == (CdcOp(op), before, after, (("id", 8812),))


@pytest.mark.parametrize("value", [None, b""])
def test_tombstone_is_none(value: bytes | None) -> None:
    """The tombstone after a delete (null or empty value) is not an error: it decodes to None."""
    assert _decode(_plain({"id": 8812}), value) is None


def test_composite_key_keeps_key_order() -> None:
    """A composite primary key keeps the column order of the message key."""
    key_schema = {
        "type": "struct",
        "fields": [
            {"type": "string", "optional": False, "field": "tenant"},
            {"type": "int64", "optional": False, "field": "order_id"},
        ],
        "optional": False,
        "name": "shop.public.order_lines.Key",
    }
    after = {"tenant": "acme", "order_id": 8812, "qty": 2}
    value = _event("c", None, after, table="order_lines")
    change = _decode(_wrapped({"tenant": "acme", "order_id": 8812}, key_schema), _wrapped(value, VALUE_SCHEMA))
    assert change is not None
    assert change.table == "public.order_lines"
    assert change.key == (("tenant", "acme"), ("order_id", 8812))
    assert change.entity_key == "order_lines:acme|8812"


@pytest.mark.parametrize(
    ("key", "op", "before", "after"),
    [
        (None, "u", None, AFTER),
        (b"", "c", None, AFTER),
        (b'{"schema": null, "payload": null}', "u", None, AFTER),
        (None, "d", BEFORE, None),  # delete: the before image has the id
    ],
)
def test_missing_key_falls_back_to_id(key: bytes | None, op: str, before: Any, after: Any) -> None:
    """Without a message key the row's id column is the key (after, or before for deletes)."""
    change = _decode(key, _plain(_event(op, before, after)))
    assert change is not None
    assert change.key == (("id", 8812),)


def test_missing_key_and_id_rejected() -> None:
    """No message key and no id column is a debezium_missing_key error."""
    with pytest.raises(DecodeError) as err:
        _decode(None, _plain(_event("c", None, {"sku": "A-1", "qty": 2})))
    assert err.value.reason == "debezium_missing_key"


def test_truncate_has_empty_key() -> None:
    """A truncate event (no key, no row images) decodes with an empty key."""
    change = _decode(None, _plain(_event("t", None, None)))
    assert change is not None
    assert (change.op, change.key, change.before, change.after) == (CdcOp.TRUNCATE, (), None, None)


def test_absent_lsn_and_txid() -> None:
    """A source block without lsn and txId (or with nulls) gives lsn 0 and tx_id ''."""
    event = _event("c", None, AFTER, txId=None)
    del event["source"]["lsn"]
    change = _decode(None, _plain(event))
    assert change is not None
    assert (change.lsn, change.tx_id) == (0, "")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (None, b"{not json"),
        (None, b"\xff\xfe"),
        (b"{not json", _plain(UPDATE_PAYLOAD)),
        (None, b"[1, 2]"),
    ],
)
def test_invalid_json_rejected(key: bytes | None, value: bytes) -> None:
    """A value or key that is not JSON (or not an object) is a debezium_invalid_json error."""
    with pytest.raises(DecodeError) as err:
        _decode(key, value)
    assert err.value.reason == "debezium_invalid_json"


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({k: v for k, v in UPDATE_PAYLOAD.items() if k != "op"}, "'op'"),
        ({k: v for k, v in UPDATE_PAYLOAD.items() if k != "source"}, "'source'"),
        ({**UPDATE_PAYLOAD, "source": {"db": "shop", "schema": "public"}}, "'source.table'"),
        ({"ts_ms": 1764411303577}, "'op'"),  # heartbeat
        ({"source": UPDATE_PAYLOAD["source"], "databaseName": "shop", "ddl": "ALTER TABLE orders ..."}, "'op'"),
    ],
)
def test_missing_field_rejected(value: dict[str, Any], field: str) -> None:
    """Events without op, source or table (including heartbeats and schema changes) are debezium_missing_field."""
    with pytest.raises(DecodeError) as err:
        _decode(None, _plain(value))
    assert err.value.reason == "debezium_missing_field"
    assert field in err.value.message


@pytest.mark.parametrize(
    "value",
    [
        {**UPDATE_PAYLOAD, "op": "x"},
        {**UPDATE_PAYLOAD, "source": "shop"},
        {**UPDATE_PAYLOAD, "after": [1, 2]},
        {**UPDATE_PAYLOAD, "source": {**UPDATE_PAYLOAD["source"], "lsn": "24023928"}},
    ],
)
def test_ill_typed_field_rejected(value: dict[str, Any]) -> None:
    """An unknown op or a field of the wrong JSON type is a debezium_invalid_field error."""
    with pytest.raises(DecodeError) as err:
        _decode(None, _plain(value))
    assert err.value.reason == "debezium_invalid_field"


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
# A real envelope with some of its fields, or of its source block's fields, replaced by arbitrary JSON.
_MUTATED = st.builds(
    lambda fields, source: {**UPDATE_PAYLOAD, **fields, "source": {**UPDATE_PAYLOAD["source"], **source}},
    st.dictionaries(st.sampled_from(["before", "after", "op", "ts_ms"]), _JSON, max_size=2),
    st.dictionaries(st.sampled_from(["ts_ms", "schema", "table", "txId", "lsn", "db"]), _JSON, max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    st.none() | _JSON.map(_plain) | st.binary(max_size=16),
    _MUTATED.map(_plain) | _JSON.map(_plain) | st.binary(max_size=64),
)
def test_arbitrary_messages_never_crash(key: bytes | None, value: bytes) -> None:
    """Arbitrary keys and values either decode (to a RowChange or None) or raise DecodeError, nothing else."""
    try:
        change = _decode(key, value)
    except DecodeError:
        return
    assert change is None or isinstance(change, RowChange)
