"""Avro binary data (the Avro 1.12 specification) → the values Kafka Connect's ``JsonConverter`` would have written.

A small reader of what a schema registry's converter writes (no Avro library is a dependency): the primitives,
records, enums, arrays, maps, unions and fixed, and the logical ``decimal`` on ``bytes``/``fixed`` with the schema's
scale. Values come out as the JSON form of the same change, so that one Debezium decoder serves both: a record is a
``dict``, a union its branch's value, ``bytes``/``fixed`` base64 text, an enum its symbol, and a decimal a
:class:`decimal.Decimal` with its scale (``12.50`` stays ``12.50``), as :mod:`streamer.decode.debezium_forms` makes
of a precise decimal in JSON; so is Debezium's ``io.debezium.data.VariableScaleDecimal`` struct (its
``connect.name``), which carries its own scale. A float that is not finite is kept as its text (``NaN``), as no JSON
number can hold it.

Both the schema (from the registry, untrusted) and the data are bounded: nesting deeper than ``MAX_NESTING``, more
than ``MAX_ITEMS`` values in one datum, more than ``MAX_SCHEMA_NODES`` named or nested types in one schema, a length
past the end of the data, trailing bytes, invalid UTF-8, an out-of-range int or union branch, each raise
:class:`~streamer.decode.errors.DecodeError` (``avro_invalid`` for data, ``avro_invalid_schema`` for a schema).
"""

from __future__ import annotations

import base64
import json
import math
import struct
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from streamer.decode.errors import DecodeError

__all__ = ["MAX_ITEMS", "MAX_NESTING", "MAX_SCHEMA_NODES", "Schema", "parse_schema", "read"]

MAX_NESTING = 32  # records, arrays, maps and unions inside one another (as for a JSON row value)
MAX_ITEMS = 100_000  # values in one datum: array items and map entries of zero bytes each (null) cost no data
MAX_SCHEMA_NODES = 10_000  # types in one schema
_MAX_SCALE = 1000  # as for a JSON precise decimal
_MAX_DECIMAL_BYTES = 1536  # as debezium_forms.MAX_DECIMAL_TEXT's base64: a longer unscaled value is refused
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_VARIABLE = "io.debezium.data.VariableScaleDecimal"
_BAD = "avro_invalid"
_BAD_SCHEMA = "avro_invalid_schema"


@dataclass(slots=True, eq=False)
class Schema:
    """One compiled Avro type: its ``kind`` (a primitive name, record, enum, array, map, union, fixed or decimal)
    and what reading it needs."""

    kind: str
    name: str = ""
    fields: list[tuple[str, Schema]] = field(default_factory=list)  # record
    symbols: tuple[str, ...] = ()  # enum
    items: Schema | None = None  # array and map values
    branches: list[Schema] = field(default_factory=list)  # union
    size: int = -1  # fixed (and a decimal on fixed); -1 for bytes
    scale: int = 0  # decimal
    variable: bool = False  # a record that is Debezium's VariableScaleDecimal


class _Compiler:
    """Turns a schema's JSON into :class:`Schema` nodes, resolving named types in their namespaces."""

    def __init__(self) -> None:
        self.named: dict[str, Schema] = {}
        self.nodes = 0

    def compile(self, doc: Any, namespace: str, depth: int) -> Schema:
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES or depth > MAX_NESTING:
            raise DecodeError(_BAD_SCHEMA, f"schema over {MAX_SCHEMA_NODES} types or {MAX_NESTING} levels deep")
        if isinstance(doc, str):
            return self._reference(doc, namespace)
        if isinstance(doc, list):
            branches = [self.compile(b, namespace, depth + 1) for b in doc]
            if not branches or any(b.kind == "union" for b in branches):
                raise DecodeError(_BAD_SCHEMA, "a union is empty or holds a union")
            return Schema("union", branches=branches)
        if not isinstance(doc, dict):
            raise DecodeError(_BAD_SCHEMA, f"not a schema: {doc!r:.40}")
        kind = doc.get("type")
        if isinstance(kind, dict | list):
            return self.compile(kind, namespace, depth + 1)
        if kind in ("bytes", "fixed") and doc.get("logicalType") == "decimal":
            node = Schema("decimal", scale=_decimal_scale(doc))
            if kind == "fixed":
                node.size = _size(doc)
                self._define(doc, namespace, node)
            return node
        if kind in _PRIMITIVES:
            return Schema(kind)
        if kind == "record" or kind == "error":
            node = Schema("record")
            full = self._define(doc, namespace, node)
            node.variable = doc.get("connect.name") == _VARIABLE
            inner = full.rpartition(".")[0]
            fields = doc.get("fields")
            if not isinstance(fields, list):
                raise DecodeError(_BAD_SCHEMA, f"record {full!r:.60} has no fields list")
            for f in fields:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                    raise DecodeError(_BAD_SCHEMA, f"a field of {full!r:.60} has no name")
                node.fields.append((f["name"], self.compile(f.get("type"), inner, depth + 1)))
            return node
        if kind == "enum":
            symbols = doc.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise DecodeError(_BAD_SCHEMA, "an enum's symbols are not a list of names")
            node = Schema("enum", symbols=tuple(symbols))
            self._define(doc, namespace, node)
            return node
        if kind == "array" or kind == "map":
            return Schema(kind, items=self.compile(doc.get("items" if kind == "array" else "values"), namespace,
                                                   depth + 1))  # fmt: skip
        if kind == "fixed":
            node = Schema("fixed", size=_size(doc))
            self._define(doc, namespace, node)
            return node
        if isinstance(kind, str):
            return self._reference(kind, namespace)
        raise DecodeError(_BAD_SCHEMA, f"unknown type {kind!r:.40}")

    def _reference(self, name: str, namespace: str) -> Schema:
        if name in _PRIMITIVES:
            return Schema(name)
        found = self.named.get(name) or self.named.get(f"{namespace}.{name}" if namespace else name)
        if found is None:
            raise DecodeError(_BAD_SCHEMA, f"unknown type name {name!r:.60}")
        return found

    def _define(self, doc: dict[str, Any], namespace: str, node: Schema) -> str:
        name, space = doc.get("name"), doc.get("namespace")
        if not isinstance(name, str) or not name:
            raise DecodeError(_BAD_SCHEMA, "a named type has no name")
        if "." not in name and isinstance(space, str):
            namespace = space
        full = name if "." in name or not namespace else f"{namespace}.{name}"
        node.name = full
        self.named[full] = node
        return full


def _size(doc: dict[str, Any]) -> int:
    size = doc.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 1 << 20:
        raise DecodeError(_BAD_SCHEMA, f"a fixed size of {size!r:.20}")
    return size


def _decimal_scale(doc: dict[str, Any]) -> int:
    """The ``scale`` of a decimal (0 when absent, as the specification says); Connect's ``connect.parameters``
    carry it as text too, and agree."""
    scale = doc.get("scale", 0)
    params = doc.get("connect.parameters")
    if "scale" not in doc and isinstance(params, dict) and isinstance(params.get("scale"), str):
        text = params["scale"]
        scale = int(text) if text.lstrip("-").isdigit() and len(text) < 6 else None
    if not isinstance(scale, int) or isinstance(scale, bool) or abs(scale) > _MAX_SCALE:
        raise DecodeError(_BAD_SCHEMA, f"decimal scale {scale!r:.20} is not an integer of at most {_MAX_SCALE}")
    return scale


def parse_schema(text: str | bytes) -> Schema:
    """The compiled schema of its JSON text; :class:`DecodeError` (``avro_invalid_schema``) for anything else."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise DecodeError(_BAD_SCHEMA, f"schema is not JSON: {exc}"[:200]) from None
    return _Compiler().compile(doc, "", 0)


class _Reader:
    __slots__ = ("data", "items", "pos")

    def __init__(self, data: bytes) -> None:
        self.data, self.pos, self.items = data, 0, 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.data):
            raise DecodeError(_BAD, f"a length of {n} past the end of the data (at byte {self.pos})")
        out, self.pos = self.data[self.pos : end], end
        return out

    def long(self) -> int:
        shift = value = 0
        while True:
            if self.pos >= len(self.data):
                raise DecodeError(_BAD, "the data ends inside a number")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift > 63:
                raise DecodeError(_BAD, "a number longer than 10 bytes")
        if value >> 64:
            raise DecodeError(_BAD, "a number over 64 bits")
        return (value >> 1) ^ -(value & 1)

    def int32(self) -> int:
        value = self.long()
        if not -(1 << 31) <= value < 1 << 31:
            raise DecodeError(_BAD, f"an int out of range: {value}")
        return value

    def count(self, n: int) -> None:
        self.items += n
        if self.items > MAX_ITEMS:
            raise DecodeError(_BAD, f"over {MAX_ITEMS} values in one message")

    def blocks(self) -> Any:
        """The item counts of an array's or map's blocks (a negative count is followed by the block's size)."""
        while True:
            n = self.long()
            if n == 0:
                return
            if n < 0:
                n = -n
                self.long()  # the block's size in bytes: not needed to read it
            self.count(n)
            yield n


def _float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def _decimal(raw: bytes, scale: int) -> Decimal:
    if len(raw) > _MAX_DECIMAL_BYTES:
        raise DecodeError(_BAD, f"a decimal of {len(raw)} bytes")
    return Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale)


def _value(schema: Schema, r: _Reader, depth: int) -> Any:
    kind = schema.kind
    if kind == "null":
        return None
    if kind == "boolean":
        byte = r.take(1)[0]
        if byte > 1:
            raise DecodeError(_BAD, f"a boolean byte of {byte}")
        return byte == 1
    if kind == "int":
        return r.int32()
    if kind == "long":
        return r.long()
    if kind == "float":
        return _float(struct.unpack("<f", r.take(4))[0])
    if kind == "double":
        return _float(struct.unpack("<d", r.take(8))[0])
    if kind == "string":
        try:
            return r.take(r.long()).decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError(_BAD, "a string is not UTF-8") from None
    if kind == "bytes" or kind == "fixed":
        raw = r.take(r.long() if schema.size < 0 else schema.size)
        return base64.b64encode(raw).decode("ascii")
    if kind == "decimal":
        return _decimal(r.take(r.long() if schema.size < 0 else schema.size), schema.scale)
    if kind == "enum":
        index = r.int32()
        if not 0 <= index < len(schema.symbols):
            raise DecodeError(_BAD, f"enum index {index} of {len(schema.symbols)} symbols")
        return schema.symbols[index]
    if depth >= MAX_NESTING:
        raise DecodeError(_BAD, f"values nested over {MAX_NESTING} levels deep")
    if kind == "union":
        index = r.long()
        if not 0 <= index < len(schema.branches):
            raise DecodeError(_BAD, f"union branch {index} of {len(schema.branches)}")
        return _value(schema.branches[index], r, depth + 1)
    if kind == "record":
        r.count(len(schema.fields))
        out = {name: _value(f, r, depth + 1) for name, f in schema.fields}
        if schema.variable and isinstance(out.get("scale"), int) and isinstance(out.get("value"), str):
            return _variable(out["scale"], out["value"])
        return out
    assert schema.items is not None
    if kind == "array":
        return [_value(schema.items, r, depth + 1) for n in r.blocks() for _ in range(n)]
    entries: dict[str, Any] = {}
    for n in r.blocks():
        for _ in range(n):
            key = _value(_STRING, r, depth + 1)
            entries[key] = _value(schema.items, r, depth + 1)
    return entries


def _variable(scale: int, value: str) -> Decimal:
    if abs(scale) > _MAX_SCALE:
        raise DecodeError(_BAD, f"decimal scale {scale} is not an integer of at most {_MAX_SCALE}")
    return _decimal(base64.b64decode(value), scale)


_STRING = Schema("string")


def read(schema: Schema, data: bytes) -> Any:
    """The value of ``data``, one datum of ``schema`` filling it exactly."""
    r = _Reader(data)
    value = _value(schema, r, 0)
    if r.pos != len(data):
        raise DecodeError(_BAD, f"{len(data) - r.pos} byte(s) after the datum")
    return value
