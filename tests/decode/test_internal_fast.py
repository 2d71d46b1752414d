"""The internal topic's read path in pydantic-core against the one it replaced, on what stage 1 really writes and
on hostile messages: every message decodes to an equal event (same types, floats by their repr), or both refuse it
with the same error and message.

``_reference`` is ``streamer.decode.internal.decode`` as it was before the fast path (``json``, then the strings
shared, then the event checked by ``TypeAdapter.validate_python``), kept here verbatim as the yardstick.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from processors.model.events import ACCESS_FIELDS, Access, RowChange
from streamer.decode import internal
from streamer.decode.jsontext import loads
from streamer.decode.strings import SharedStrings
from tests.test_wire import accesses, changes, json_values

# ---- the path before, verbatim ------------------------------------------------------------------------------------

_EVENTS: dict[str, tuple[str, TypeAdapter[Any], frozenset[str]]] = {
    "access": ("access", TypeAdapter(Access), frozenset(ACCESS_FIELDS)),
    "row_change": ("change", TypeAdapter(RowChange), frozenset(internal._CHANGE_FIELDS)),
}
_SHARED_FIELDS = ("entity", "table", "service", "version", "statement", "route", "function", "file", "trace_exception")
_SHARED_LISTS = ("params", "set_values", "predicates", "set_exprs")


def _reference_share(body: dict[str, Any], shared: SharedStrings) -> None:
    share = shared.table.setdefault
    for name in _SHARED_FIELDS:
        value = body.get(name)
        if type(value) is str:
            body[name] = share(value, value)
    for name in _SHARED_LISTS:
        items = body.get(name)
        if type(items) is list:
            body[name] = [
                share(x, x)
                if type(x) is str
                else [share(y, y) if type(y) is str else y for y in x]
                if type(x) is list
                else x
                for x in items
            ]
    shared.bound()


def _reference(data: bytes, shared: SharedStrings | None = None) -> Any:
    msg = internal._object(loads(data, "internal_invalid", "internal event"), "internal event")
    if msg.get("v") != internal.SCHEMA_VERSION:
        raise ValueError(f"unsupported internal schema version {msg.get('v')!r}")
    kind = msg.get("kind")
    try:
        if kind == "watermark":
            body = internal._object(msg.get("watermark"), "watermark")
            return internal._WATERMARK.validate_python(
                {"watermark_ns": body.get("ns"), "partitions": body.get("partitions")}
            )
        if kind == "relay":
            return internal._relay(msg.get("relay"))
        field_name, adapter, known = _EVENTS[str(kind)]
        body = internal._object(msg.get(field_name), str(kind))
        unknown = sorted(set(body) - known)
        if unknown:
            raise ValueError(f"{kind}: unknown field(s) {unknown[:5]}")
        if shared is not None and kind == "access":
            _reference_share(body, shared)
        event = adapter.validate_python(body)
    except KeyError:
        raise ValueError(f"unknown internal event kind {kind!r}") from None
    except ValidationError as exc:
        raise ValueError(f"{kind}: {exc.error_count()} invalid field(s): {str(exc)[:300]}") from None
    return event


# ---- comparing ----------------------------------------------------------------------------------------------------


def _canon(x: Any) -> Any:
    """``x`` with every value's type beside it (True is not 1, 1.0 is not 1), floats by repr (NaN equals NaN)."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, tuple((f.name, _canon(getattr(x, f.name))) for f in dataclasses.fields(x)))
    if isinstance(x, enum.Enum):
        return (type(x).__name__, x.value)
    if type(x) in (tuple, list):
        return (type(x).__name__, tuple(_canon(y) for y in x))
    if type(x) is dict:
        return ("dict", tuple((k, _canon(v)) for k, v in x.items()))
    return (type(x).__name__, repr(x))


def _outcome(decode: Any, data: bytes, shared: SharedStrings | None = None) -> Any:
    try:
        return ("event", _canon(decode(data, shared)))
    except (ValueError, KeyError, TypeError) as exc:
        return ("refused", type(exc).__name__, str(exc))


def _same(data: bytes) -> None:
    assert _outcome(internal.decode, data) == _outcome(_reference, data), data[:300]


# ---- what stage 1 writes ------------------------------------------------------------------------------------------


@cache
def _stage1_messages() -> tuple[bytes, ...]:
    """Stage 1's internal messages for 4,000 bench spans (accesses and relays), as ``make bench`` generates them."""
    from bench import run as bench
    from bench.otlp_gen import generate_run
    from streamer import config

    start = 1_796_000_000_000_000_000
    gen = generate_run(4000, 300, 1, start_ns=start, partitions=2, shape="bench")
    env = bench.settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "t", "bench-spans-t", 0, [])
    s = config.load(None, env=env)
    clock = bench._Clock()
    clock.now = start + 10_000_000_000
    metrics, tracker = bench.Metrics(), bench.PinTracker()
    processors = bench.stage_processors(s, metrics, clock, "ingest", tracker, bench.default().factories)
    stage = bench.IngestStage(s, metrics, clock, tracker=tracker, processors=processors)
    outs = [stage.process(polled) for polled in bench._polls(bench._records(gen, s.kafka.spans_topic), s)]
    clock.now += 3600 * 1_000_000_000
    outs += bench.close_all(stage)
    return tuple(m.value for o in outs for m in o.produce if m.topic == s.kafka.accesses_topic and m.value)


def _spaced(m: bytes) -> bytes:
    """An access as stage 1 wrote it before pydantic-core did (json's encoder: its separators, ``\\u`` escapes), as
    an older instance may still write it during an upgrade: the same JSON value."""
    return json.dumps(json.loads(m)).encode()


def _stage1_accesses() -> list[bytes]:
    """The accesses among stage 1's messages, as it writes them and as it wrote them before (``_spaced``)."""
    written = [m for m in _stage1_messages() if json.loads(m)["kind"] == "access"]
    return written + [_spaced(m) for m in written]


def test_stage1_writes_accesses_as_pydantic_core_does_and_the_json_value_as_before() -> None:
    """Stage 1 writes each access without json's spaces (pydantic-core's text), and its JSON value is the one json's
    encoder writes of the access's fields (the internal format is unchanged)."""
    written = [m for m in _stage1_messages() if json.loads(m)["kind"] == "access"]
    assert len(written) > 300 and all(m.startswith(b'{"v":1,"kind":"access","access":{') for m in written)
    for m in written:
        a = internal.decode(m)
        assert isinstance(a, Access)
        body = dict(zip(ACCESS_FIELDS, internal.access_values(a), strict=True))
        assert _spaced(m) == json.dumps({"v": 1, "kind": "access", "access": body}).encode()


def test_stage1_messages_decode_equal_and_by_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every access stage 1 writes, or wrote before, decodes as before, and without the checked path (the fast path
    read it)."""
    messages = _stage1_messages()
    kinds = {json.loads(m)["kind"] for m in messages}
    assert kinds == {"access", "relay"} and len(messages) > 300
    for m in messages:
        _same(m)
    accesses = _stage1_accesses()
    for m in accesses:
        _same(m)
    before = [_reference(m, SharedStrings(10**6)) for m in accesses]

    def unavailable(data: bytes, shared: SharedStrings | None) -> Any:
        raise AssertionError("the checked path read a message stage 1 wrote")

    monkeypatch.setattr(internal, "_checked", unavailable)
    after = [internal.decode(m, SharedStrings(10**6)) for m in accesses]
    assert len(after) > 600 and [_canon(a) for a in after] == [_canon(b) for b in before]


def test_a_shared_table_holds_the_same_strings_and_the_accesses_hold_its_copies() -> None:
    """Through a shared table, the accesses are those of the path before, the table holds the same strings, and each
    shared field of every access is the table's copy."""
    messages = _stage1_accesses()
    new, old = SharedStrings(10**6), SharedStrings(10**6)
    for m in messages:
        assert _outcome(internal.decode, m, new) == _outcome(_reference, m, old)
    assert new.table == old.table
    for m in messages:
        a = internal.decode(m, new)
        assert isinstance(a, Access)
        for name in _SHARED_FIELDS:
            assert getattr(a, name) is new.table[getattr(a, name)], name
        for pair in a.set_values:
            assert pair[0] is new.table[pair[0]]
        for column, op, _ in a.predicates:
            assert column is new.table[column] and op is new.table[op]
        assert a.span_id not in new.table


# ---- hostile ------------------------------------------------------------------------------------------------------

_WRONG: tuple[Any, ...] = (
    *(None, True, 0, -1, 1.0, 1.5, "1", "", "x", 2**70, -(2**64), float("nan")),
    *([], [1], ["a", 1], [[1, 2]], {}, {"a": 1}, [{"a": [None]}], [[["deep"]]]),
)


def _mutations(msg: dict[str, Any]) -> list[Any]:
    """The message with each field of its body given each wrong value, removed, doubled by an extra field, and its
    envelope's fields wrong."""
    kind = msg["kind"]
    name = "access" if kind == "access" else "change"
    body = msg[name]
    out: list[Any] = []
    for key in body:
        for wrong in _WRONG:
            out.append({**msg, name: {**body, key: wrong}})
        out.append({**msg, name: {k: v for k, v in body.items() if k != key}})
    out.append({**msg, name: {**body, "surprise": 1}})
    out += [{**msg, "v": v} for v in (2, "1", 1.0, True, None)]
    out += [{**msg, "extra": {"a": 1}}, {**msg, name: [body]}, {**msg, name: None}, {"v": 1, "kind": kind}]
    return out


def _hostile_texts(m: bytes) -> list[bytes]:
    """Byte-level damage the JSON encoder would never write: surrogates, duplicate keys, control characters, huge
    numbers, NaN, deep nesting, a BOM, trailing text. ``m`` is written with json's separators or without spaces."""
    text = m.decode()
    if not text.startswith('{"v": '):  # pydantic-core's text: the same damage, its separators
        return [_compact(t) for t in _hostile_texts(_spaced(m))]
    cut = text.index('": ', 40) + 3  # the first value of the body
    damaged = [
        text.replace('"entity": "', '"entity": "\\ud800', 1),
        text.replace('"entity": "', '"entity": "\\udc00x', 1),
        text.replace('"entity": "', '"entity": "\\ud83d\\ude00', 1),
        text.replace('"entity": "', '"entity": "a\\u0000', 1),
        text.replace('"entity": "', '"entity": "tab\t', 1),
        text.replace('"entity": ', '"entity": "first", "entity": ', 1),
        text.replace('"kind": "access"', '"kind": "access", "kind": "row_change"', 1),
        text.replace('"kind": "access", ', '"kind": "access", "access": {}, ', 1),
        text.replace('"params": [', '"params": [' + "9" * 4301 + ", ", 1),
        text.replace('"params": [', '"params": [' + "9" * 4300 + ", ", 1),
        text.replace('"params": [', '"params": [NaN, Infinity, -Infinity, 1e400, -0.0, 5e-324, ', 1),
        text.replace('"where": ', '"where": [' + "[" * 190 + "]" * 190 + ', []], "w": ', 1),
        text.replace('"where": ', '"where": [' + "[" * 300 + "]" * 300 + ', []], "w": ', 1),
        text[:cut] + "1.0e0" + text[text.index(",", cut) :],
        text + " x",
        text + " \n",
        "\ufeff" + text,
    ]
    raw = [t.encode() for t in damaged]
    raw.append(m.replace(b'"entity": "', b'"entity": "\xed\xa0\x80', 1))  # a surrogate written as UTF-8
    raw.append(m.replace(b'"entity": "', b'"entity": "\xff', 1))
    raw.append(m.replace(b'"access"', b'"acc\\u0065ss"'))
    return raw


def _compact(damaged: bytes) -> bytes:
    """A damaged text of json's separators with pydantic-core's (``": "`` and ``", "`` outside strings: the damage
    above writes neither inside one)."""
    return damaged.replace(b'": ', b'":').replace(b', "', b',"').replace(b", [", b",[").replace(b", ", b",")


def test_hostile_variants_of_real_messages_are_refused_or_read_alike() -> None:
    """Every field of real accesses given wrong types (lax reads included: an integer as 1.0 or "1"), removed or
    joined by another, the envelope wrong, bytes damaged: the same event or the same refusal as before."""
    accesses_seen = _stage1_accesses()
    sample = accesses_seen[:: max(1, len(accesses_seen) // 12)]
    refused = accepted = 0
    for m in sample:
        variants = [json.dumps(v).encode() for v in _mutations(json.loads(m))] + _hostile_texts(m)
        for data in variants:
            _same(data)
            if _outcome(_reference, data)[0] == "refused":
                refused += 1
            else:
                accepted += 1
    assert refused > 100 and accepted > 100  # both sides of the line were tried


@given(accesses)
@settings(max_examples=300)
def test_any_access_decodes_as_before(a: Access) -> None:
    _same(internal.encode_access(a))


@given(changes)
@settings(max_examples=300)
def test_any_row_change_decodes_as_before(c: RowChange) -> None:
    _same(internal.encode_row_change(c))


field_names = st.sampled_from([*ACCESS_FIELDS, *internal._CHANGE_FIELDS, "x"])


@given(st.sampled_from(["access", "row_change"]), st.dictionaries(field_names, json_values))
@settings(max_examples=300)
def test_arbitrary_bodies_decode_as_before(kind: str, body: dict[str, Any]) -> None:
    """Arbitrary JSON bodies (and bodies of a real message with arbitrary values) in the envelope stage 1 writes."""
    _same(json.dumps({"v": 1, "kind": kind, "access" if kind == "access" else "change": body}).encode())


@given(st.data())
@settings(max_examples=300)
def test_real_bodies_with_arbitrary_values_decode_as_before(data: st.DataObject) -> None:
    messages = _stage1_messages()
    msg = json.loads(data.draw(st.sampled_from([m for m in messages if json.loads(m)["kind"] == "access"])))
    body = msg["access"]
    for key in data.draw(st.lists(st.sampled_from(sorted(body)), max_size=3)):
        body[key] = data.draw(json_values)
    _same(json.dumps(msg).encode())
