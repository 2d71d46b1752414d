"""The internal stage-1 → stage-2 topic: ``Access`` and ``RowChange`` events as versioned JSON, watermarks, relays.

Accesses and row changes are keyed by entity key, so every event about one row lands in one partition and one
stage-2 consumer. A :class:`Watermark` is sent by every stage-1 instance into *every* partition: the low watermark
of the input partitions it owns (every trace with a span before it has closed and its accesses are emitted), which
is what stage 2's event time follows. A :class:`~processors.model.events.Relay` carries a stage-1 processor's share
of a window to its stage-2 half, keyed by the relay's own key.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, fields
from typing import Any

from pydantic import TypeAdapter, ValidationError

from processors.lib.json_text import one_shot
from processors.model.events import ACCESS_FIELDS, Access, Relay, RowChange, access_values
from streamer.decode.jsontext import loads
from streamer.decode.strings import SharedStrings

SCHEMA_VERSION = 1
_CHANGE_FIELDS = tuple(f.name for f in fields(RowChange))


# json writes a tuple as an array, an enum of str as its value, anything else it has no text for with ``default``.
_ENCODER = json.JSONEncoder(default=str)
_change_values = operator.attrgetter(*_CHANGE_FIELDS)


# Accesses go out one per DB span of every closed trace: json's C encoder made once (``processors.lib.json_text``),
# the same text as ``_ENCODER.encode``.
_encode_access = one_shot(json.JSONEncoder(default=str, check_circular=False))


def encode_access(a: Access) -> bytes:
    body = dict(zip(ACCESS_FIELDS, access_values(a), strict=True))
    return _encode_access({"v": SCHEMA_VERSION, "kind": "access", "access": body}).encode()


def encode_row_change(c: RowChange) -> bytes:
    body = dict(zip(_CHANGE_FIELDS, _change_values(c), strict=True))
    return _ENCODER.encode({"v": SCHEMA_VERSION, "kind": "row_change", "change": body}).encode()


@dataclass(frozen=True, slots=True)
class Watermark:
    """Stage 1's low watermark for its input partitions (``"otlp_spans/0"``)."""

    watermark_ns: int
    partitions: tuple[str, ...]


def encode_watermark(w: Watermark) -> bytes:
    body = {"ns": w.watermark_ns, "partitions": list(w.partitions)}
    return json.dumps({"v": SCHEMA_VERSION, "kind": "watermark", "watermark": body}).encode()


def encode_relay(r: Relay) -> bytes:
    body = {"component": r.component, "key": r.key, "at": r.at_ns, "body": r.body}
    return _ENCODER.encode({"v": SCHEMA_VERSION, "kind": "relay", "relay": body}).encode()


def _relay(value: Any) -> Relay:
    body = _object(value, "relay")
    component, key, at, data = body.get("component"), body.get("key"), body.get("at"), body.get("body")
    if type(component) is not str or not component or type(key) is not str or type(at) is not int:
        raise ValueError("relay: component and key must be strings, at an integer")
    return Relay(component, key, at, _object(data, "relay body"))


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not a JSON object")
    return value


_EVENTS: dict[str, tuple[str, TypeAdapter[Any], frozenset[str]]] = {
    "access": ("access", TypeAdapter(Access), frozenset(ACCESS_FIELDS)),
    "row_change": ("change", TypeAdapter(RowChange), frozenset(_CHANGE_FIELDS)),
}
_WATERMARK: TypeAdapter[Watermark] = TypeAdapter(Watermark)


# An access's strings that repeat across accesses (one per statement, table, code site, ...), and its lists whose
# items (or items' items: a predicate's column and operator) do; never its span id, its own.
_SHARED_FIELDS = ("entity", "table", "service", "version", "statement", "route", "function", "file", "trace_exception")
_SHARED_LISTS = ("params", "set_values", "predicates", "set_exprs")


def _share(body: dict[str, Any], shared: SharedStrings) -> None:
    share = shared.table.setdefault
    for name in _SHARED_FIELDS:
        value = body.get(name)
        if type(value) is str:
            body[name] = share(value, value)
    for name in _SHARED_LISTS:
        items = body.get(name)
        if type(items) is list:
            body[name] = [share(x, x) if type(x) is str else
                          [share(y, y) if type(y) is str else y for y in x] if type(x) is list else x
                          for x in items]  # fmt: skip
    shared.bound()


def decode(data: bytes, shared: SharedStrings | None = None) -> Access | RowChange | Watermark | Relay:
    """Back to events, every field checked against its declared type (the topic may carry anything: a record
    that does not validate raises ``ValueError``, so it is dead-lettered, never passed on half-typed). With
    ``shared``, an access's repeated strings are the table's copies (see ``streamer.decode.strings``)."""
    msg = _object(loads(data, "internal_invalid", "internal event"), "internal event")
    if msg.get("v") != SCHEMA_VERSION:
        raise ValueError(f"unsupported internal schema version {msg.get('v')!r}")
    kind = msg.get("kind")
    try:
        if kind == "watermark":
            body = _object(msg.get("watermark"), "watermark")
            return _WATERMARK.validate_python({"watermark_ns": body.get("ns"), "partitions": body.get("partitions")})
        if kind == "relay":
            return _relay(msg.get("relay"))
        field_name, adapter, known = _EVENTS[str(kind)]
        body = _object(msg.get(field_name), str(kind))
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"{kind}: unknown field(s) {unknown[:5]}")
        if shared is not None and kind == "access":
            _share(body, shared)
        event: Access | RowChange = adapter.validate_python(body)
    except KeyError:
        raise ValueError(f"unknown internal event kind {kind!r}") from None
    except ValidationError as exc:
        raise ValueError(f"{kind}: {exc.error_count()} invalid field(s): {str(exc)[:300]}") from None
    return event
