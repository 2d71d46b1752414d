"""streamer.wire: Access and RowChange through the internal topic's JSON, exactly."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processors.api.telemetry import Telemetry
from processors.model.events import (
    ACCESS_FIELDS,
    Access,
    CdcOp,
    DbOperation,
    LockMode,
    Relay,
    RowChange,
    access_values,
)
from streamer.decode import internal as wire
from streamer.decode.strings import SharedStrings

text = st.text(max_size=40)
ints = st.integers(min_value=-(2**70), max_value=2**70)
# NaN is left out only because NaN != NaN would fail the equality, not the round trip.
scalars = st.none() | st.booleans() | ints | st.floats(allow_nan=False) | text
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4), max_leaves=12
)
images = st.none() | st.dictionaries(text, json_values, max_size=6)

accesses = st.builds(
    Access,
    entity=text,
    table=text,
    operation=st.sampled_from(DbOperation),
    lock=st.sampled_from(LockMode),
    trace_id=text,
    span_id=text,
    service=text,
    version=text,
    start_ns=ints,
    end_ns=ints,
    statement=text,
    params=st.lists(scalars, max_size=5).map(tuple),
    set_values=st.lists(st.tuples(text, scalars), max_size=4).map(tuple),
    predicates=st.lists(st.tuples(text, text, scalars), max_size=4).map(tuple),
    read_version=text,
    tx_id=text,
    error=st.booleans(),
    function=text,
    file=text,
    idempotency_key=text,
    links=st.lists(text, max_size=3).map(tuple),
    set_exprs=st.lists(text, max_size=3).map(tuple),
    trace_sampling=st.none() | st.floats(min_value=0.0, max_value=1.0),
)
changes = st.builds(
    RowChange,
    table=text,
    op=st.sampled_from(CdcOp),
    key=st.lists(st.tuples(text, scalars), min_size=1, max_size=3).map(tuple),
    before=images,
    after=images,
    commit_ts_ms=ints,
    ts_ms=ints,
    lsn=ints,
    tx_id=text,
    topic=text,
    partition=st.integers(min_value=0, max_value=1_000),
    offset=st.integers(min_value=0, max_value=2**63 - 1),
)


@given(accesses)
def test_access_round_trips_exactly(a: Access) -> None:
    """An Access decodes to an equal Access, with enums and tuples restored."""
    back = wire.decode(wire.encode_access(a))
    assert back == a
    assert isinstance(back, Access)
    assert type(back.operation) is DbOperation
    assert type(back.lock) is LockMode
    assert all(type(x) is tuple for x in (back.params, back.set_values, back.predicates, back.links, back.set_exprs))


def _json_text(a: Access) -> str:
    """The access as json's encoder writes it (the internal format's text before pydantic-core wrote it)."""
    body = dict(zip(ACCESS_FIELDS, access_values(a), strict=True))
    return json.dumps({"v": 1, "kind": "access", "access": body}, default=str)


any_floats = st.floats() | st.sampled_from([math.inf, -math.inf, math.nan, -0.0, 5e-324, 1e22])
odd_scalars = st.none() | st.booleans() | ints | any_floats | text | st.text(st.characters(codec="utf-8"), max_size=8)


@given(accesses, st.lists(odd_scalars, max_size=6), st.lists(st.tuples(text, odd_scalars), max_size=3), any_floats)
def test_access_text_is_the_json_value_json_writes(a: Access, params: list[Any], sets: list[Any], f: float) -> None:
    """What stage 1 writes is the JSON value json's encoder writes of the access's fields, whatever the values: NaN
    and infinities as json writes them, integers past 64 bits, any text, in field order."""
    a = dataclasses.replace(a, params=tuple(params), set_values=tuple(sets), key_confidence=f, trace_sampling=f)
    written = wire.encode_access(a)
    assert json.dumps(json.loads(written)) == _json_text(a)


def test_an_access_of_a_lone_surrogate_is_written_by_json_escaped_and_refused_as_before() -> None:
    """pydantic-core refuses to write a lone surrogate: such an access is written by json's encoder, escaped, as
    before, and stage 2 refuses it as before (a dead letter, not a crash of stage 1). A value json has no text for
    is written as its str."""
    a = Access("orders:\ud800", "orders", DbOperation.READ, LockMode.NONE, "t", "s", "shop", "v1", 1, 2, "SELECT",
               params=("\udc00x", Decimal("1.5")))  # fmt: skip
    written = wire.encode_access(a)
    assert written == _json_text(a).encode() and b"\\ud800" in written
    with pytest.raises(ValueError, match="lone surrogate"):
        wire.decode(written)
    plain = dataclasses.replace(a, entity="orders:1", params=(Decimal("1.5"),))
    assert json.loads(wire.encode_access(plain))["access"]["params"] == ["1.5"]


@given(st.lists(accesses, min_size=1, max_size=6))
def test_access_round_trips_exactly_through_a_shared_string_table(batch: list[Access]) -> None:
    """Sharing repeated strings (a table of 3, so that it evicts) changes no value of any access."""
    shared = SharedStrings(3)
    assert [wire.decode(wire.encode_access(a), shared) for a in batch] == batch
    assert len(shared) <= 3  # bound() after every access


def test_accesses_share_their_repeated_strings_but_not_their_own() -> None:
    """Two accesses of one statement hold one copy of it, of their table, code site and predicate columns; each keeps
    its own span id (never offered to the table). Past its bound the table starts again, counting what it held."""
    base = Access("orders:1", "orders", DbOperation.WRITE, LockMode.NONE, "t" * 32, "s" * 16, "shop", "v1", 1, 2,
                  "UPDATE orders SET status = $1 WHERE id = $2", params=("paid", 1), set_values=(("status", "paid"),),
                  predicates=(("version", "=", "v" + "3"),), function="pay", file="shop/orders.py")  # fmt: skip
    other = dataclasses.replace(base, span_id="r" * 16)
    shared = SharedStrings(64, telemetry := Telemetry("decode"))
    one, two = (wire.decode(wire.encode_access(a), shared) for a in (base, other))
    assert isinstance(one, Access) and isinstance(two, Access)
    for name in ("entity", "table", "statement", "service", "version", "function", "file"):
        assert getattr(one, name) is getattr(two, name), name
    assert one.set_values[0][1] is two.set_values[0][1] and one.predicates[0][2] is two.predicates[0][2]
    assert one.params[0] is two.params[0]
    assert one.span_id is not two.span_id and one.trace_id is not two.trace_id
    assert telemetry.dropped == {"max_shared_strings": 0}
    small = SharedStrings(2, telemetry)
    for s in ("a", "b", "c"):
        small(s)
        small.bound()
    assert len(small) == 0 and telemetry.dropped == {"max_shared_strings": 3}  # past 2, it started again
    kept = small("".join(["d", "e"]))
    assert small("de") is kept and len(small) == 1


@given(changes)
def test_row_change_round_trips_exactly(c: RowChange) -> None:
    """A RowChange decodes to an equal RowChange, key as a tuple of pairs and images as dicts."""
    back = wire.decode(wire.encode_row_change(c))
    assert back == c
    assert isinstance(back, RowChange)
    assert type(back.op) is CdcOp
    assert type(back.key) is tuple
    assert all(type(pair) is tuple for pair in back.key)


def test_watermark_round_trips_and_a_malformed_one_is_refused() -> None:
    """A watermark (a zero one too: a partition just assigned, held) decodes to an equal one; partitions that are
    not a list of names are refused."""
    for w in (wire.Watermark(7, ("otlp_spans/0", "shop.public.orders/0")), wire.Watermark(0, ("otlp_spans/1",))):
        assert wire.decode(wire.encode_watermark(w)) == w
    with pytest.raises(ValueError):
        wire.decode(b'{"v": 1, "kind": "watermark", "watermark": {"ns": 5, "partitions": 3}}')


def test_relay_round_trips_and_a_malformed_one_is_refused() -> None:
    """A relay decodes to an equal one (its body is the receiving processor's to validate); a relay without a
    component or with a body that is not an object is refused."""
    r = Relay("regressions", "regressions", 7, {"start_ns": 5, "samples": [1.5, 2.0], "signatures": {"e": 1}})
    assert wire.decode(wire.encode_relay(r)) == r
    for bad in ({"component": "", "key": "k", "at": 1, "body": {}}, {"component": "x", "key": 1, "at": 1, "body": {}},
                {"component": "x", "key": "k", "at": 1, "body": [1]}, {"component": "x", "key": "k", "body": {}},
                {"component": "x", "key": "k", "at": "1", "body": {}}, [1]):  # fmt: skip
        with pytest.raises((ValueError, TypeError)):
            wire.decode(json.dumps({"v": 1, "kind": "relay", "relay": bad}).encode())


def test_encoding_is_versioned_json() -> None:
    """The internal format is a JSON object with the schema version and the event kind."""
    c = RowChange("public.orders", CdcOp.UPDATE, (("id", 1),), None, {"id": 1}, 5, 6, 7, "9")
    doc = json.loads(wire.encode_row_change(c))
    assert (doc["v"], doc["kind"]) == (wire.SCHEMA_VERSION, "row_change")
    assert doc["change"]["op"] == "u"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"null",
        b"[1]",
        b'"access"',
        b"42",
        b'{"v": 2, "kind": "access", "access": {}}',
        b'{"v": 1}',
        b'{"v": 1, "kind": "span", "span": {}}',
        b'{"v": 1, "kind": "access", "access": [1]}',
        b'{"v": 1, "kind": "access", "access": null}',
        b'{"v": 1, "kind": "access", "access": {"entity": "x"}}',
        b'{"v": 1, "kind": "row_change", "change": {"op": "u"}}',
        b'{"v": 1, "kind": "row_change", "change": "x"}',
        b'{"v": 1, "kind": "row_change", "change": {"key": 5, "op": "u"}}',
    ],
)
def test_malformed_raises_the_documented_errors(data: bytes) -> None:
    """Anything malformed raises ValueError, KeyError or TypeError (what stage 2 catches), never anything else."""
    with pytest.raises((ValueError, KeyError, TypeError)):
        wire.decode(data)


def test_unknown_field_is_rejected() -> None:
    """A field the event does not have is an error, not silently dropped."""
    c = RowChange("public.orders", CdcOp.UPDATE, (("id", 1),), None, {"id": 1}, 5, 6, 7, "9")
    doc: dict[str, Any] = json.loads(wire.encode_row_change(c))
    doc["change"]["surprise"] = 1
    with pytest.raises(ValueError, match="unknown field"):
        wire.decode(json.dumps(doc).encode())


access_fields = st.sampled_from([*ACCESS_FIELDS, "x"])
change_fields = st.sampled_from([*wire._CHANGE_FIELDS, "x"])
bodies = st.one_of(
    st.tuples(st.just("access"), st.dictionaries(access_fields, json_values)),
    st.tuples(st.just("row_change"), st.dictionaries(change_fields, json_values)),
    st.tuples(st.sampled_from(["access", "row_change", "other"]), json_values),
)


@given(bodies)
def test_arbitrary_json_fails_only_with_the_documented_errors(body: tuple[str, Any]) -> None:
    """Arbitrary JSON in a versioned envelope either decodes or raises ValueError, KeyError or TypeError."""
    kind, content = body
    data = json.dumps({"v": 1, "kind": kind, "access" if kind == "access" else "change": content}).encode()
    with contextlib.suppress(ValueError, KeyError, TypeError):
        wire.decode(data)
