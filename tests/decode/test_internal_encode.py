"""The internal topic's access message by field (``streamer.decode.internal.encode_access``) against the general
encoder it replaced: the same bytes for every access stage 1 makes on the benchmark's traffic, and for generated
accesses, hostile ones included (a field not of its declared type, NaN, huge ints, nested tuples, lists); where the
old one raises, the new one raises the same error.

``_reference`` is ``encode_access`` as it was before (its fields as a dict, the message by ``json``'s C encoder),
kept here verbatim as the yardstick.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.otlp_gen import generate_run
from bench.run import run_stage, settings_env
from processors.lib.json_text import one_shot
from processors.model.events import ACCESS_FIELDS, Access, DbOperation, Keying, LockMode, access_values
from processors.sql import SqlAccessExtractor
from streamer import config
from streamer.decode import internal
from tests.processors.test_sql_access import db_span
from tests.test_wire import accesses, json_values, scalars, text

# ---- the encoder before, verbatim ---------------------------------------------------------------------------------

_encode_access = one_shot(json.JSONEncoder(default=str, check_circular=False))


def _reference(a: Access) -> bytes:
    body = dict(zip(ACCESS_FIELDS, access_values(a), strict=True))
    return _encode_access({"v": internal.SCHEMA_VERSION, "kind": "access", "access": body}).encode()


def _same(a: Access) -> None:
    """The new encoder writes ``a`` as the reference does, or raises what it raises."""
    try:
        expected = _reference(a)
    except Exception as exc:  # whatever it is, the new one must raise it too
        with pytest.raises(type(exc)):
            internal.encode_access(a)
        return
    assert internal.encode_access(a) == expected


# ---- what stage 1 writes ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stage_accesses() -> list[Access]:
    """Every access stage 1 sends on the benchmark's traffic: both shapes, spans with and without parameters (stock
    instrumentation records none: unbound keys), so keyed, predicate and unbound accesses, WHERE trees, upserts."""
    seen: list[Access] = []
    encode = internal.encode_access
    s = config.load(None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "enc", "enc-spans", 0, []))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(internal, "encode_access", lambda a: seen.append(a) or encode(a))
        for shape in ("bench", "collector"):
            run_stage(generate_run(3_000, 300, 1, partitions=2, shape=shape), s, keep=False)
    extractor = SqlAccessExtractor({"orders": ["id"], "order_lines": ["order_id", "line"]})
    for statement, params in _STATEMENTS:  # what the benchmark does not send: keyed reads, unbound keys, IN, ...
        for with_params in (params, ()):
            seen.extend(extractor.accesses(db_span(statement, with_params, row_version="7", tx_id="tx-1")))
    return seen


_STATEMENTS: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("SELECT * FROM orders WHERE id = %s", (5,)),
    ("SELECT * FROM orders WHERE id IN (%s, %s) FOR SHARE", (5, 6)),
    ("UPDATE orders SET total = total + %s, note = %s WHERE id = %s AND version = %s", (1.5, 'a "q" \\ é', 7, 3)),
    ("DELETE FROM order_lines WHERE order_id = %s AND line = %s", (7, 2)),
    ("INSERT INTO order_lines (order_id, line, sku) VALUES (%s, %s, %s), (%s, %s, %s)", (1, 1, "a", 1, 2, None)),
    ("INSERT INTO orders (id, total) VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET total = 1", (9, 10**20)),
    ("UPDATE orders SET status = 'paid' WHERE customer = %s OR total > %s", ("c\u2028", -0.0)),
    ("SELECT * FROM orders WHERE total BETWEEN %s AND %s AND status IS NOT NULL", (1, 2)),
    ("INSERT INTO orders (total) VALUES (%s)", (True,)),
)


def test_every_access_stage_1_sends_is_written_byte_for_byte_as_before(stage_accesses: list[Access]) -> None:
    kinds = {(a.keyed, a.where is not None, bool(a.params), a.unbound_key) for a in stage_accesses}
    assert len(stage_accesses) > 500 and len(kinds) >= 5  # keyed and predicate, with and without parameters
    for a in stage_accesses:
        assert internal.encode_access(a) == _reference(a)


_ODD: tuple[Any, ...] = (None, "", "x", 0, 1, True, False, 1.5, -0.0, float("nan"), float("inf"), 2**70, [], ["a"], (),
                         ("a", 1), ("a",), Keying.BY_CHANGE, LockMode.FOR_UPDATE, b"x", {"k": (1,)})  # fmt: skip


def test_a_field_not_of_its_declared_type_is_written_by_json_whole(stage_accesses: list[Access]) -> None:
    """Every field given each of a set of values of other types (a str field holding a number, a bool in an int
    field, a list, None or "" for a tuple, an enum for a str, NaN, bytes, a dict): each written as json writes it
    (the general path), never by the typed shortcut."""
    for a in (stage_accesses[0], stage_accesses[-1]):
        for name in ACCESS_FIELDS:
            for value in _ODD:
                odd = dataclasses.replace(a, **{name: value})
                assert internal.encode_access(odd) == _reference(odd), (name, value)


# ---- generated accesses -------------------------------------------------------------------------------------------

_floats = st.floats()  # NaN and the infinities too: json writes them NaN / Infinity
_trees: st.SearchStrategy[Any] = st.recursive(scalars | _floats, lambda inner: st.lists(inner, max_size=3).map(tuple))
_odd = json_values | _floats | st.sampled_from([*DbOperation, *LockMode, *Keying]) | st.binary(max_size=4)


@st.composite
def _full_accesses(draw: st.DrawFn) -> Access:
    """An access with every field drawn (``tests.test_wire.accesses`` leaves the predicate fields at their
    defaults), and sometimes one field replaced by a value of another type."""
    a = draw(accesses)
    a = dataclasses.replace(
        a,
        line=draw(st.integers(min_value=-(2**70), max_value=2**70)),
        located_by=draw(text),
        candidates=tuple(draw(st.lists(text, max_size=3))),
        route=draw(text),
        request_start_ns=draw(st.integers()),
        request_end_ns=draw(st.integers()),
        trace_error=draw(st.booleans()),
        trace_exception=draw(text),
        trace_status=draw(st.integers()),
        keyed=draw(st.booleans()),
        exact=draw(st.booleans()),
        where=draw(st.none() | st.tuples(_trees, st.lists(st.lists(scalars, max_size=2).map(tuple)).map(tuple))),
        keying=draw(st.sampled_from([k.value for k in Keying])),
        key_candidates=draw(st.integers(min_value=0, max_value=2**40)),
        key_confidence=draw(_floats),
        filters=tuple(draw(st.lists(text, max_size=3))),
        set_columns=tuple(draw(st.lists(text, max_size=3))),
        unbound=tuple(draw(st.lists(st.tuples(text, text), max_size=2))),
        unbound_key=draw(st.booleans()),
        trace_sampling=draw(st.none() | _floats),
    )
    if draw(st.booleans()):
        a = dataclasses.replace(a, **{draw(st.sampled_from(ACCESS_FIELDS)): draw(_odd)})
    return a


@settings(max_examples=400)
@given(_full_accesses())
def test_generated_accesses_are_written_byte_for_byte_as_before(a: Access) -> None:
    _same(a)


def test_the_message_is_the_versioned_envelope_the_decoder_reads_first(stage_accesses: list[Access]) -> None:
    """What it writes starts as the decoder's fast path expects and decodes back to the access."""
    for a in stage_accesses[:50]:
        data = internal.encode_access(a)
        assert data.startswith(b'{"v": 1, "kind": "access", "access": {"entity": ')
        assert internal.decode(data) == a
