"""Real Debezium 3.6 messages in the forms teams run it with (recorded from the local connector by
``tests/decode/fixtures/record_debezium.py``): precise decimals with schemas, transaction metadata and heartbeats;
the unwrapped record (``ExtractNewRecordState``, ``add.fields=op,table,lsn,source.ts_ms``, deletes rewritten)."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from processors.api.telemetry import Telemetry
from processors.model.events import CdcOp, RowChange
from processors.sql.values import UNAVAILABLE, same_value
from streamer.decode import DecodeError, decode_row_change
from streamer.decode.config import DecodeConfig
from streamer.decode.debezium import ChangeStats
from streamer.decode.debezium_forms import MAX_DECIMAL_TEXT
from streamer.decode.registry import DECODERS, Record

FIXTURES = Path(__file__).parent / "fixtures"


def recorded(form: str) -> list[dict[str, Any]]:
    """A fixture file's recorded messages (key and value decoded from base64)."""
    return [
        {"topic": r["topic"], "key": r["key"] and base64.b64decode(r["key"]),
         "value": r["value"] and base64.b64decode(r["value"])}
        for r in json.loads((FIXTURES / f"debezium_{form}.json").read_text())
    ]  # fmt: skip


def _decode(form: str) -> tuple[list[RowChange], ChangeStats]:
    stats = ChangeStats()
    out = [decode_row_change(r["key"], r["value"], topic=r["topic"], partition=0, offset=i, stats=stats)
           for i, r in enumerate(recorded(form))]  # fmt: skip
    return [c for c in out if c is not None], stats


def test_precise_decimals_decode_with_their_scale() -> None:
    """NUMERIC(10,2) (bytes + scale in the schema) and NUMERIC (VariableScaleDecimal) become Decimals with scale."""
    changes, stats = _decode("precise")
    assert [c.op for c in changes] == [CdcOp.CREATE, CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE]
    first, second, update, delete = changes
    assert first.after == {"id": 1, "amount": Decimal("12.50"), "ratio": Decimal("3.14159"), "note": "a"}
    assert str(first.after["amount"]) == "12.50"  # the column's scale kept
    assert second.after is not None and second.after["amount"] == Decimal("-0.05") and second.after["ratio"] == -7
    assert update.before == first.after
    assert update.after == {"id": 1, "amount": Decimal("99999999.99"),
                            "ratio": Decimal("12345678901234567890.123"), "note": "a"}  # fmt: skip
    assert delete.before == second.after and delete.after is None
    assert stats.schemaless == 0 and stats.oversize_values == 0


def test_precise_decimal_equals_the_bound_parameter() -> None:
    """A statement bound with 12.50 (as a span's parameter text or a number) matches the decoded row image."""
    first = _decode("precise")[0][0]
    assert first.after is not None
    assert same_value("12.50", first.after["amount"]) is True
    assert same_value(12.5, first.after["amount"]) is True
    assert same_value("12.51", first.after["amount"]) is False


def test_transaction_metadata_and_heartbeats_counted_not_refused() -> None:
    """BEGIN/END events of <prefix>.transaction and heartbeats carry no row: counted, never a DecodeError."""
    changes, stats = _decode("precise")
    assert stats.transactions == 6 and stats.heartbeats == 2
    assert [c.tx_id for c in changes[:2]] == ["5788", "5788"]  # source.txId: one transaction for both inserts


def test_precise_decimal_without_schema_kept_as_received() -> None:
    """Without schemas.enable the scale is nowhere: the base64 text stays, counted as schemaless; it compares with
    no number (unknown), never equal to a wrong value. The variable-scale struct describes itself and decodes."""
    record = next(r for r in recorded("precise") if r["topic"].endswith(".prices") and r["value"])
    plain = json.dumps(json.loads(record["value"])["payload"]).encode()
    stats = ChangeStats()
    change = decode_row_change(None, plain, topic=record["topic"], partition=0, offset=0, stats=stats)
    assert change is not None and change.after is not None
    assert change.after["amount"] == "BOI=" and change.after["ratio"] == Decimal("3.14159")
    assert stats.schemaless == 1
    assert same_value("12.50", change.after["amount"]) is None


def test_unwrapped_records_decode_without_before_image() -> None:
    """ExtractNewRecordState with add.fields and rewritten deletes: op, table, lsn, commit time from the __ fields;
    updates have no before-image; a delete's row is its before-image."""
    changes, stats = _decode("unwrap")
    assert [c.op for c in changes] == [CdcOp.CREATE, CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE]
    assert all(c.table == "public.prices" for c in changes)
    assert changes[0].key == (("id", 1),) and changes[0].lsn > 0 and changes[0].commit_ts_ms > 0
    assert changes[0].after == {"id": 1, "amount": "12.50", "ratio": "3.14159", "note": "a"}
    assert changes[2].before is None and changes[2].after is not None
    assert changes[3].before == {"id": 2, "amount": "-0.05", "ratio": "-7", "note": "b"} and changes[3].after is None
    assert stats.unwrapped == 4


def test_unwrapped_record_without_op_refused_with_the_option_to_set() -> None:
    record = recorded("unwrap")[0]
    doc = {k: v for k, v in json.loads(record["value"]).items() if not k.startswith("__")}
    doc["__table"] = "prices"
    with pytest.raises(DecodeError) as err:
        decode_row_change(record["key"], json.dumps(doc).encode(), topic=record["topic"], partition=0, offset=0)
    assert err.value.reason == "debezium_unwrapped_no_op" and "add.fields=op" in err.value.message


@pytest.mark.parametrize(
    ("field", "reason"),
    [({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}, "field": "a"},
      "debezium_invalid_decimal"),
     ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "99999"},
       "field": "a"}, "debezium_invalid_decimal")],
)  # fmt: skip
def test_malformed_precise_decimal_refused(field: dict[str, Any], reason: str) -> None:
    schema = {"type": "struct", "fields": [{"type": "struct", "fields": [field], "field": "after"}]}
    payload = {"op": "c", "source": {"schema": "public", "table": "t"}, "before": None, "after": {"a": "no base64!"}}
    with pytest.raises(DecodeError) as err:
        decode_row_change(b'{"id":1}', json.dumps({"schema": schema, "payload": payload}).encode(), topic="x.public.t",
                          partition=0, offset=0)  # fmt: skip
    assert err.value.reason == reason


def test_overlong_decimal_kept_unavailable_and_counted() -> None:
    payload = {"op": "c", "source": {"schema": "public", "table": "t"}, "before": None,
               "after": {"id": 1, "a": {"scale": 0, "value": "A" * (MAX_DECIMAL_TEXT + 4)}}}  # fmt: skip
    stats = ChangeStats()
    change = decode_row_change(None, json.dumps(payload).encode(), topic="x.public.t", partition=0, offset=0,
                               stats=stats)  # fmt: skip
    assert change is not None and change.after == {"id": 1, "a": UNAVAILABLE} and stats.oversize_values == 1


def test_registry_counts_each_form() -> None:
    telemetry = Telemetry("decode.debezium")
    decode = DECODERS["debezium"](DecodeConfig(), telemetry)
    for i, r in enumerate(recorded("precise") + recorded("unwrap")):
        decode(Record(r["topic"], 0, i, r["key"], r["value"]))
    assert telemetry.events["row_changes"] == 8 and telemetry.events["unwrapped_changes"] == 4
    assert telemetry.events["heartbeats"] == 2 and telemetry.events["transaction_events"] == 6
    assert telemetry.events["tombstones"] == 1 and "schemaless_changes" in telemetry.events
