"""The internal stage-1 → stage-2 topic: ``Access`` and ``RowChange`` events as versioned JSON, watermarks, relays.

Every event about one row lands in one partition and one stage-2 consumer: row changes are keyed by entity key, and
a batch's accesses go *packed* (:func:`pack_accesses`), one message per internal partition holding the accesses
whose entity keys map there (:func:`partition_of`: the producer's default partitioner, so a packed access lands
where its key would have sent it alone), in their order, as positional rows under the field names that read them.
A stage-1 instance that does not know the topic's partitions sends each access alone, keyed by its entity key
(:func:`encode_access`); stage 2 reads both forms (:func:`decode_all`). A :class:`Watermark` is sent by every
stage-1 instance into *every* partition: the low watermark of the input partitions it owns (every trace with a span
before it has closed and its accesses are emitted), which is what stage 2's event time follows. A
:class:`~processors.model.events.Relay` carries a stage-1 processor's share of a window to its stage-2 half, keyed by
the relay's own key.
"""

from __future__ import annotations

import json
import operator
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from aiokafka.partitioner import DefaultPartitioner
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config
from pydantic_core import CoreConfig, PydanticSerializationError, SchemaValidator, to_json
from typing_extensions import TypedDict

from processors.lib.json_text import one_shot
from processors.model.events import ACCESS_FIELDS, Access, Relay, RowChange, access_values, new_access
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


# ---- accesses packed: one message per internal partition of a batch -------------------------------------------

# What one packed message holds, at most: this many accesses (then this many bytes, ``kafka.accesses_message_bytes``,
# by halving; an access larger than that goes alone). A message per partition per batch is what saves the per-record
# work of the producer, the broker and the consumer, and half the bytes (the field names once): bench/RESULTS.md.
PACK_ROWS = 256
_PACKED_HEAD: dict[str, Any] = {"v": SCHEMA_VERSION, "kind": "accesses", "fields": list(ACCESS_FIELDS)}
# A packed message as this version writes it starts so: its fields are this version's, in order (the fast read).
PACKED_PREFIX = to_json(_PACKED_HEAD)[:-1] + b',"rows":'


_PARTITIONER = DefaultPartitioner()  # the Kafka sink's (``sinks.kafka.producer``): a keyed message's partition


def partition_of(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` the producer's default partitioner (aiokafka's, Kafka's Java client's:
    murmur2 of the key) sends a message keyed ``key`` to: where a row's changes are, and so its accesses go."""
    every = list(range(partitions))
    return int(_PARTITIONER(key, every, every))


def encode_accesses(accesses: Sequence[Access]) -> bytes:
    """One packed message: the envelope, the field names, one positional row per access (``ACCESS_FIELDS`` order),
    written by pydantic-core as :func:`encode_access` writes one access. Raises ``PydanticSerializationError`` for a
    string it cannot write (:func:`pack_accesses` sends that access alone)."""
    return to_json({**_PACKED_HEAD, "rows": [access_values(a) for a in accesses]}, fallback=str)


def pack_accesses(accesses: Iterable[Access], partitions: int, max_bytes: int) -> list[tuple[int, bytes]]:
    """``accesses`` as messages, (partition, value): grouped by the partition each entity key maps to
    (:func:`partition_of`), in their order within it, packed at most :data:`PACK_ROWS` accesses and ``max_bytes``
    bytes a message (an access larger than that alone). An access holding a string only json writes (a lone
    surrogate, which stage 2 refuses) goes alone, as :func:`encode_access` writes it, so that it is refused alone."""
    groups: dict[int, list[Access]] = {}
    placed: dict[str, int] = {}  # entity key -> its partition, for this call (murmur2 in Python: ~4 µs a key)
    for a in accesses:
        partition = placed.get(a.entity)
        if partition is None:
            partition = placed[a.entity] = partition_of(a.entity.encode(), partitions)
        groups.setdefault(partition, []).append(a)
    out: list[tuple[int, bytes]] = []
    for partition, group in groups.items():
        for start in range(0, len(group), PACK_ROWS):
            out += [(partition, value) for value in _fitted(group[start : start + PACK_ROWS], max_bytes)]
    return out


def _fitted(accesses: list[Access], max_bytes: int) -> list[bytes]:
    try:
        value = encode_accesses(accesses)
    except PydanticSerializationError:
        return _apart(accesses, max_bytes)
    if len(value) <= max_bytes or len(accesses) == 1:
        return [value]
    half = len(accesses) // 2
    return _fitted(accesses[:half], max_bytes) + _fitted(accesses[half:], max_bytes)


def _apart(accesses: list[Access], max_bytes: int) -> list[bytes]:
    """The accesses pydantic-core cannot write, each alone (json's text) between the packs of the others, in order."""
    out: list[bytes] = []
    run: list[Access] = []
    for a in accesses:
        try:
            to_json(access_values(a), fallback=str)
        except PydanticSerializationError:
            out += _fitted(run, max_bytes) if run else []
            out.append(encode_access(a))
            run = []
        else:
            run.append(a)
    return out + (_fitted(run, max_bytes) if run else [])


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
_ACCESS_NAMES = frozenset(ACCESS_FIELDS)


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


# A packed message of this version: its envelope and each row checked in one pass, strict, each row a tuple of the
# types of ``Access``'s fields in order (the same checks as an access read alone), then made an ``Access``.
_ROW: Any = tuple[tuple(typing.get_type_hints(Access)[f] for f in ACCESS_FIELDS)]  # type: ignore[misc]


@with_config(_STRICT)
class _PackedMessage(TypedDict):
    v: Literal[1]
    kind: Literal["accesses"]
    fields: list[str]
    rows: list[_ROW]


_READ_PACKED = SchemaValidator(TypeAdapter(_PackedMessage).core_schema, CoreConfig(cache_strings=False))
Event = Access | RowChange | Watermark | Relay


def decode_all(data: bytes, shared: SharedStrings | None = None) -> Sequence[Event]:
    """The events of one internal message: a packed message's accesses, in order, or the one event of any other
    message (as :func:`decode` reads it). A packed row that does not validate refuses the whole message
    (``ValueError``, naming the row)."""
    if type(data) is bytes and data.startswith(PACKED_PREFIX):
        try:
            rows = _READ_PACKED.validate_json(data)["rows"]
        except ValidationError:
            pass  # the checked path refuses it with its own message, or reads what only it reads
        else:
            accesses = [new_access(*row) for row in rows]
            return [_share(a, shared) for a in accesses] if shared is not None else accesses
        return _checked(data, shared)
    fast = _fast(data, shared)
    return (fast,) if fast is not None else _checked(data, shared)


def _packed(msg: dict[str, Any], shared: SharedStrings | None) -> list[Event]:
    """A packed message the fast read did not take (the fields of an older or newer stage 1, json's text): each row
    read as the access its field names make of it, the checked way (lax). An unknown field name, or a row of
    another length, refuses the message."""
    names, rows = msg.get("fields"), msg.get("rows")
    if not isinstance(names, list) or not all(type(n) is str for n in names) or not isinstance(rows, list):
        raise ValueError("accesses: fields must be a list of names, rows a list")
    unknown = sorted(set(names) - _ACCESS_NAMES)
    if unknown:
        raise ValueError(f"access: unknown field(s) {unknown[:5]}")
    adapter = _EVENTS["access"][1]
    out: list[Event] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(names):
            raise ValueError(f"accesses: row {i} is not a list of {len(names)} values")
        try:
            access: Access = adapter.validate_python(dict(zip(names, row, strict=True)))
        except ValidationError as exc:
            raise ValueError(f"access (row {i}): {exc.error_count()} invalid field(s): {str(exc)[:300]}") from None
        out.append(_share(access, shared) if shared is not None else access)
    return out


def decode(data: bytes, shared: SharedStrings | None = None) -> Event:
    """Back to events, every field checked against its declared type (the topic may carry anything: a record
    that does not validate raises ``ValueError``, so it is dead-lettered, never passed on half-typed). With
    ``shared``, an access's repeated strings are the table's copies (see ``streamer.decode.strings``). One event: a
    packed message (several accesses) is read by :func:`decode_all`, and refused here."""
    fast = _fast(data, shared)
    if fast is not None:
        return fast
    events = _checked(data, shared)
    if len(events) != 1 or not isinstance(events, tuple):
        raise ValueError("a packed accesses message holds several events: read it with decode_all")
    event: Event = events[0]
    return event


def _fast(data: bytes, shared: SharedStrings | None) -> Event | None:
    """A single access or row change as stage 1 writes it, read by pydantic-core; None: the checked path's."""
    if type(data) is bytes:  # (anything else, the checked path reads or refuses as it always did)
        for prefix, field_name, adapter in _FAST:
            if data.startswith(prefix):
                try:
                    event = adapter.validate_json(data)[field_name]
                except ValidationError:
                    return None  # the checked path refuses it with its own message, or reads what only it reads
                return _share(event, shared) if shared is not None and field_name == "access" else event
    return None


def _checked(data: bytes, shared: SharedStrings | None) -> Sequence[Event]:
    """``decode_all`` by ``json`` and a check of every field (lax: an integer written 1.0 or "1" is read as one): a
    packed message's accesses (a list), or a tuple of the one event of any other message."""
    msg = _object(loads(data, "internal_invalid", "internal event"), "internal event")
    if msg.get("v") != SCHEMA_VERSION:
        raise ValueError(f"unsupported internal schema version {msg.get('v')!r}")
    kind = msg.get("kind")
    if kind == "accesses":
        return _packed(msg, shared)
    return (_checked_event(msg, kind, shared),)


def _checked_event(msg: dict[str, Any], kind: Any, shared: SharedStrings | None) -> Event:
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
