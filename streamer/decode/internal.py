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
from typing import Any, Literal

from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from pydantic_core import CoreConfig, PydanticSerializationError, SchemaValidator, to_json
from typing_extensions import TypedDict

from processors.lib.json_text import one_shot
from processors.model.events import ACCESS_FIELDS, Access, Relay, RowChange, access_values
from streamer.decode.jsontext import loads
from streamer.decode.strings import SharedStrings

SCHEMA_VERSION = 1
_CHANGE_FIELDS = tuple(f.name for f in fields(RowChange))


# json writes a tuple as an array, an enum of str as its value, anything else it has no text for with ``default``.
_ENCODER = json.JSONEncoder(default=str)
_change_values = operator.attrgetter(*_CHANGE_FIELDS)


# Accesses go out one per DB span of every closed trace, written by pydantic-core from the dataclass itself (no dict
# made of it first): the JSON value json's encoder writes (keys in field order, floats by their shortest repr,
# Infinity and NaN as json writes them, anything else as its ``str``), without json's spaces and ``\u`` escapes.
# A string pydantic-core cannot write as UTF-8 (a lone surrogate, which a JSON span's escapes can make) is written
# by json's encoder (``_encode_access``), escaped, as it always was; stage 2 reads either text.
_encode_access = one_shot(json.JSONEncoder(default=str, check_circular=False))


def encode_access(a: Access) -> bytes:
    message = {"v": SCHEMA_VERSION, "kind": "access", "access": a}
    try:
        return to_json(message, fallback=str)
    except PydanticSerializationError:
        message["access"] = dict(zip(ACCESS_FIELDS, access_values(a), strict=True))
        return _encode_access(message).encode()


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


# An access's strings that repeat across accesses (one per statement, table, code site, ...); never its span id, its
# own. And those of its tuples: parameter values, set columns and values, predicates' columns and operators.
_SHARED_FIELDS = ("entity", "table", "service", "version", "statement", "route", "function", "file", "trace_exception")
_shared_values = operator.attrgetter(*_SHARED_FIELDS)
_tuples = operator.attrgetter("params", "set_values", "predicates", "set_exprs")


def _share(access: Access, shared: SharedStrings) -> Access:
    """The access with its repeated strings the table's copies (see ``streamer.decode.strings``), then the table
    bounded. The access was just made by the decoder and nobody else holds it yet: its fields are replaced in place
    (a frozen dataclass refuses ``setattr``, not ``object.__setattr__``), a string only where the table holds
    another copy of it. Its tuples are of the types just checked: scalars, pairs, triples, strings."""
    share = shared.table.setdefault
    for name, value in zip(_SHARED_FIELDS, _shared_values(access), strict=True):
        kept = share(value, value)
        if kept is not value:
            object.__setattr__(access, name, kept)
    params, set_values, predicates, set_exprs = _tuples(access)
    if params:
        object.__setattr__(access, "params", tuple([share(x, x) if type(x) is str else x for x in params]))
    if set_values:
        pairs = [(share(c, c), share(x, x) if type(x) is str else x) for c, x in set_values]
        object.__setattr__(access, "set_values", tuple(pairs))
    if predicates:
        terms = [(share(c, c), share(o, o), share(x, x) if type(x) is str else x) for c, o, x in predicates]
        object.__setattr__(access, "predicates", tuple(terms))
    if set_exprs:
        object.__setattr__(access, "set_exprs", tuple([share(x, x) for x in set_exprs]))
    shared.bound()
    return access


# The read path of what stage 1 writes, in pydantic-core: the JSON parsed and every field checked in one pass, strict
# (a JSON string is no int, a number no string; pydantic builds the recursive WHERE tree's union lax, where each JSON
# value is taken as its own type), the envelope's fields only these. What it refuses goes the checked path below:
# read by ``json``, checked by field, lax as it has always been, so that it is refused with the message it always
# was, or read as it always was (an integer written 1.0, an envelope field of a newer stage 1). What it accepts, the
# checked path accepts as an equal event (tests/decode/test_internal_fast.py compares them).
_STRICT = ConfigDict(strict=True, extra="forbid")


@with_config(_STRICT)
class _AccessMessage(TypedDict):
    v: Literal[1]
    kind: Literal["access"]
    access: Access


@with_config(_STRICT)
class _ChangeMessage(TypedDict):
    v: Literal[1]
    kind: Literal["row_change"]
    change: RowChange


# What a message starts with as stage 1 writes it (an access by pydantic-core, or by ``json`` as before and for a
# string only ``json`` writes; a row change by ``json``) only chooses the read tried first; anything else is read the
# checked way. The validators go without pydantic-core's process-wide string cache: a value is its own string, as
# ``json`` makes it, unless ``_share`` makes it the table's copy (a span id never is).
_READ_ACCESS, _READ_CHANGE = (
    SchemaValidator(TypeAdapter(message).core_schema, CoreConfig(cache_strings=False))
    for message in (_AccessMessage, _ChangeMessage)
)
_FAST: tuple[tuple[bytes, str, SchemaValidator], ...] = (
    (b'{"v":1,"kind":"access",', "access", _READ_ACCESS),
    (b'{"v": 1, "kind": "access", ', "access", _READ_ACCESS),
    (b'{"v": 1, "kind": "row_change", ', "change", _READ_CHANGE),
)


def decode(data: bytes, shared: SharedStrings | None = None) -> Access | RowChange | Watermark | Relay:
    """Back to events, every field checked against its declared type (the topic may carry anything: a record
    that does not validate raises ``ValueError``, so it is dead-lettered, never passed on half-typed). With
    ``shared``, an access's repeated strings are the table's copies (see ``streamer.decode.strings``)."""
    if type(data) is bytes:  # (anything else, the checked path reads or refuses as it always did)
        for prefix, field_name, adapter in _FAST:
            if data.startswith(prefix):
                try:
                    event = adapter.validate_json(data)[field_name]
                except ValidationError:
                    break  # the checked path refuses it with its own message, or reads what only it reads
                return _share(event, shared) if shared is not None and field_name == "access" else event
    return _checked(data, shared)


def _checked(data: bytes, shared: SharedStrings | None) -> Access | RowChange | Watermark | Relay:
    """``decode`` by ``json`` and a check of every field (lax: an integer written 1.0 or "1" is read as one)."""
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
        event: Access | RowChange = adapter.validate_python(body)
    except KeyError:
        raise ValueError(f"unknown internal event kind {kind!r}") from None
    except ValidationError as exc:
        raise ValueError(f"{kind}: {exc.error_count()} invalid field(s): {str(exc)[:300]}") from None
    return _share(event, shared) if shared is not None and isinstance(event, Access) else event
