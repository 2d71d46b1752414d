"""Real Debezium 3.6 messages through Apicurio Registry's Avro converter (recorded by
``tests/decode/fixtures/record_debezium.py <state> avro``: Confluent framing, content ids), read through a schema
registry served over HTTP from the schemas recorded with them: the envelope with precise decimals, transaction
metadata and heartbeats; the unwrapped record. Both decode to the same row changes the JSON forms give."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from processors.api.telemetry import Telemetry
from processors.model.events import CdcOp, RowChange
from streamer.decode import DecodeError, decode_row_change
from streamer.decode.config import DecodeConfig, SchemaRegistryConfig
from streamer.decode.debezium import ChangeStats
from streamer.decode.errors import DecodeUnavailable
from streamer.decode.registry import DECODERS, Record
from streamer.decode.schema_registry import SchemaRegistry
from tests.decode.registry_server import Served, registry_server
from tests.decode.test_debezium_forms import recorded

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def served() -> Iterator[Served]:
    with registry_server() as found:
        yield found


@pytest.fixture
def registry_url(served: Served) -> str:
    return served.url


def _registry(url: str, **config: Any) -> SchemaRegistry:
    return SchemaRegistry(SchemaRegistryConfig(url=url, **config), Telemetry("decode.debezium"))


def _decode(form: str, url: str) -> tuple[list[RowChange], ChangeStats]:
    records, registry, stats = recorded(form), _registry(url), ChangeStats()
    asyncio.run(registry.prepare(d for r in records for d in (r["key"], r["value"])))
    out = [decode_row_change(r["key"], r["value"], topic=r["topic"], partition=0, offset=i, stats=stats,
                             registry=registry) for i, r in enumerate(records)]  # fmt: skip
    return [c for c in out if c is not None], stats


def test_avro_envelope_decodes_like_the_json_one(registry_url: str) -> None:
    """INSERT, UPDATE, DELETE with a NUMERIC(10,2) (bytes + scale in the Avro schema) and a NUMERIC
    (VariableScaleDecimal): exact Decimals with their scale, before-images, txId, LSN, commit time."""
    changes, stats = _decode("avro", registry_url)
    assert [c.op for c in changes] == [CdcOp.CREATE, CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE]
    first, second, update, delete = changes
    assert first.after == {"id": 1, "amount": Decimal("12.50"), "ratio": Decimal("3.14159"), "note": "a"}
    assert str(first.after["amount"]) == "12.50"
    assert first.table == "public.prices" and first.key == (("id", 1),)
    assert second.after is not None and str(second.after["amount"]) == "-0.05" and second.after["ratio"] == -7
    assert update.before == first.after
    assert update.after == {"id": 1, "amount": Decimal("99999999.99"),
                            "ratio": Decimal("12345678901234567890.123"), "note": "a"}  # fmt: skip
    assert delete.before == second.after and delete.after is None
    assert first.tx_id == second.tx_id != "" and first.lsn > 0 and first.commit_ts_ms > 0
    assert stats.transactions == 6 and stats.heartbeats == 2 and stats.schemaless == 0


def test_avro_unwrapped_decodes_without_before_image(registry_url: str) -> None:
    changes, stats = _decode("avro_unwrap", registry_url)
    assert [c.op for c in changes] == [CdcOp.CREATE, CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE]
    assert all(c.table == "public.prices" for c in changes) and changes[0].lsn > 0
    assert changes[0].after == {"id": 1, "amount": Decimal("12.50"), "ratio": Decimal("3.14159"), "note": "a"}
    assert changes[2].before is None and changes[2].after is not None
    assert changes[3].before == {"id": 2, "amount": Decimal("-0.05"), "ratio": Decimal("-7"), "note": "b"}
    assert stats.unwrapped == 4


def test_each_schema_fetched_once_and_counted(registry_url: str, served: Served) -> None:
    telemetry = Telemetry("decode.debezium")
    config = DecodeConfig(schema_registry=SchemaRegistryConfig(url=registry_url))
    decode = DECODERS["debezium"](config, telemetry)
    records = [Record(r["topic"], 0, i, r["key"], r["value"]) for i, r in enumerate(recorded("avro") * 2)]
    asyncio.run(decode.prepare(records))  # type: ignore[attr-defined]
    asyncio.run(decode.prepare(records))  # type: ignore[attr-defined]  # (cached: nothing asked again)
    for record in records:
        decode(record)
    assert telemetry.events["row_changes"] == 8 and telemetry.events["schemas_fetched"] == len(served.asked)
    assert len(served.asked) == len(set(served.asked)) == 6  # key and value of the table, beats, transactions


def test_unknown_schema_id_refused_with_reason(registry_url: str) -> None:
    record = next(r for r in recorded("avro") if r["topic"].endswith(".prices") and r["value"])
    value = b"\x00" + (999).to_bytes(4, "big") + record["value"][5:]
    registry = _registry(registry_url)
    asyncio.run(registry.prepare([record["key"], value]))
    with pytest.raises(DecodeError) as err:
        decode_row_change(record["key"], value, topic=record["topic"], partition=0, offset=0, registry=registry)
    assert err.value.reason == "avro_unknown_schema"


def test_registry_away_or_failing_is_retryable_not_a_dead_letter(registry_url: str, served: Served) -> None:
    """A 5xx (or no registry listening) raises DecodeUnavailable: the runner pauses and asks again."""
    record = recorded("avro")[0]
    served.status = 503
    with pytest.raises(DecodeUnavailable):
        asyncio.run(_registry(registry_url).prepare([record["value"]]))
    with pytest.raises(DecodeUnavailable):
        asyncio.run(_registry("http://127.0.0.1:9/api", timeout_s=2).prepare([record["value"]]))


def test_credentials_sent_and_never_in_the_error(registry_url: str, served: Served) -> None:
    record = recorded("avro")[0]
    served.auth = "Basic " + base64.b64encode(b"team:s3cret-pass").decode()
    with pytest.raises(DecodeUnavailable) as err:
        asyncio.run(_registry(registry_url, username="team", password="wrong-pass").prepare([record["value"]]))
    assert "wrong-pass" not in str(err.value) and "401" in str(err.value)
    asyncio.run(_registry(registry_url, username="team", password="s3cret-pass").prepare([record["value"]]))


def test_avro_without_a_registry_refused_with_the_setting_to_set() -> None:
    record = recorded("avro")[0]
    with pytest.raises(DecodeError) as err:
        decode_row_change(record["key"], record["value"], topic=record["topic"], partition=0, offset=0)
    assert err.value.reason == "avro_no_registry" and "decode.schema_registry.url" in err.value.message


def test_schema_cache_bounded_evictions_counted(registry_url: str) -> None:
    """Past ``max_schemas`` the least recently used is evicted (counted); the batch's own schemas stay usable."""
    records = [r for r in recorded("avro") if r["value"]]
    registry = _registry(registry_url, max_schemas=1)
    asyncio.run(registry.prepare(d for r in records for d in (r["key"], r["value"])))
    stats = ChangeStats()
    changes = [decode_row_change(r["key"], r["value"], topic=r["topic"], partition=0, offset=0, stats=stats,
                                 registry=registry) for r in records]  # fmt: skip
    assert len([c for c in changes if c is not None]) == 4
    assert registry.telemetry.dropped["schema_cache"] == 5


def test_apicurio_framing_by_global_id(registry_url: str) -> None:
    """``wire=apicurio``: magic byte, 8-byte global id, ``GET {url}/ids/globalIds/{id}`` answering the schema text."""
    record = next(r for r in recorded("avro") if r["topic"].endswith(".prices") and r["value"])
    key, value = (
        b"\x00" + int.from_bytes(d[1:5], "big").to_bytes(8, "big") + d[5:] for d in (record["key"], record["value"])
    )
    registry = _registry(registry_url, wire="apicurio")
    asyncio.run(registry.prepare([key, value]))
    change = decode_row_change(key, value, topic=record["topic"], partition=0, offset=0, registry=registry)
    assert change is not None and change.after is not None and str(change.after["amount"]) == "12.50"


def test_avro_and_json_forms_give_the_same_row_changes(registry_url: str) -> None:
    """The same statements recorded through the JSON converter (precise decimals, schemas on) and through the Avro
    one decode to the same changes: one shape downstream, whatever the converter."""
    from tests.decode.test_debezium_forms import _decode as decode_json

    def shape(changes: list[RowChange]) -> list[tuple[object, ...]]:
        return [(c.op, c.table, c.key, c.before, c.after) for c in changes]

    assert shape(_decode("avro", registry_url)[0]) == shape(decode_json("precise")[0])
    envelope = shape(_decode("avro", registry_url)[0])
    unwrapped = [(op, table, key, None if op is CdcOp.UPDATE else before, after)
                 for op, table, key, before, after in envelope]  # fmt: skip  # (no before-image of an update)
    assert shape(_decode("avro_unwrap", registry_url)[0]) == unwrapped
