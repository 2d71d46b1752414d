"""Hostile Avro: arbitrary and mutated registry-framed messages, and arbitrary schemas, through the Debezium decoder.

Properties: a message in a registry's framing (real Debezium Avro messages with bytes changed, cut or inserted, or
arbitrary bytes after a known schema id) either decodes to a row change (or None) or raises ``DecodeError`` (a dead
letter with its reason), never anything else; a schema of any shape either compiles or raises ``DecodeError``, and
data of any bytes read with one that compiles does the same.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from processors.api.telemetry import Telemetry
from processors.model.events import RowChange
from streamer.decode import DecodeError, decode_row_change
from streamer.decode.avro import Schema, parse_schema, read
from streamer.decode.config import SchemaRegistryConfig
from streamer.decode.schema_registry import SchemaRegistry
from tests.fuzz.profiles import fuzz

FIXTURES = Path(__file__).parents[1] / "decode" / "fixtures"
SCHEMAS: dict[str, str] = json.loads((FIXTURES / "debezium_avro_schemas.json").read_text())
RECORDS = [
    (r["topic"], r["key"] and base64.b64decode(r["key"]), r["value"] and base64.b64decode(r["value"]))
    for form in ("avro", "avro_unwrap")
    for r in json.loads((FIXTURES / f"debezium_{form}.json").read_text())
]


class _Recorded(SchemaRegistry):
    """The registry of the recorded schemas, without HTTP (what is fetched is not what is fuzzed here)."""

    def _fetch(self, schema_id: int) -> Schema | DecodeError:
        text = SCHEMAS.get(str(schema_id))
        return parse_schema(text) if text else DecodeError("avro_unknown_schema", str(schema_id))


_IDS = [*sorted(int(i) for i in SCHEMAS), 0, 2**32 - 1]  # every recorded schema, and two ids the registry lacks
REGISTRY = _Recorded(SchemaRegistryConfig(url="http://127.0.0.1:9"), Telemetry("decode.debezium"))
asyncio.run(REGISTRY.prepare(b"\x00" + i.to_bytes(4, "big") for i in _IDS))  # what decoding any of them needs


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, at, byte in edits:
        at = at % (len(out) + 1)
        if kind == 0 and at < len(out):
            out[at] = byte
        elif kind == 1:
            out.insert(at, byte)
        elif kind == 2:
            del out[at:]
        else:
            del out[at : at + 1]
    return bytes(out)


_edits = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6)
_ids = st.sampled_from(_IDS)


def _decodes_or_refuses(topic: str, key: bytes | None, value: bytes | None) -> None:
    try:
        change = decode_row_change(key, value, topic=topic, partition=0, offset=0, registry=REGISTRY)
    except DecodeError:
        return
    assert change is None or isinstance(change, RowChange)


@fuzz(st.sampled_from(RECORDS), _edits, st.booleans(), examples=300, long_examples=50_000)
def test_mutated_avro_messages_decode_or_are_refused(record: Any, edits: Any, on_key: bool) -> None:
    """See the module docstring."""
    topic, key, value = record
    if on_key and key:
        key = _mutate(key, edits)
    elif value:
        value = _mutate(value, edits)
    _decodes_or_refuses(topic, key, value)


@fuzz(_ids, st.binary(max_size=300), st.sampled_from(RECORDS), examples=300, long_examples=50_000)
def test_arbitrary_bytes_after_a_schema_id_decode_or_are_refused(schema_id: int, data: bytes, record: Any) -> None:
    value = b"\x00" + schema_id.to_bytes(4, "big") + data
    _decodes_or_refuses(record[0], record[1], value)


_names = st.sampled_from(["a", "b", "r", "x.y", "null", "int", "long", "bytes", "string", "double", "float",
                          "boolean", "record", "enum", "array", "map", "fixed", "decimal", ""])  # fmt: skip
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _names,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "name",
                    "namespace",
                    "fields",
                    "items",
                    "values",
                    "symbols",
                    "size",
                    "logicalType",
                    "scale",
                    "connect.name",
                    "connect.parameters",
                ]
            ),
            inner,
            max_size=6,
        )
    ),
    max_leaves=30,
)


@fuzz(_json, st.binary(max_size=200), examples=300, long_examples=50_000)
def test_arbitrary_schemas_compile_or_are_refused_and_read_any_bytes(doc: Any, data: bytes) -> None:
    try:
        schema = parse_schema(json.dumps(doc))
    except DecodeError:
        return
    with contextlib.suppress(DecodeError):
        read(schema, data)
