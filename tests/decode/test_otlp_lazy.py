"""The lazy protobuf decoder gives the spans, truncation counts and refusals of the eager one it replaced.

``_eager_decode`` is that eager decoder (every span's attributes and events read when it is decoded), kept here as
the oracle; ``literal_params`` (pattern first, then ``ast``) is compared with ``ast`` alone.
"""

from __future__ import annotations

import pickle
import warnings
from sys import intern
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench.otlp_gen import generate
from processors.model.events import Resource, SpanKind, StatusCode
from processors.model.span import Span, SpanDetail
from streamer.decode import DecodeError, DecodeOptions, DecodeStats, decode_traces_proto
from streamer.decode._attrs import (
    EXCEPTION_EVENT,
    EXCEPTION_KEYS,
    INTERNED_SLOTS,
    KINDS,
    NO_FIELDS,
    QUERY_PARAM,
    RESOURCE_KEYS,
    SPAN_SLOTS,
    STATUSES,
    TEXT_SLOTS,
    Extractor,
    is_db,
    sampling_of,
)
from streamer.decode.literals import literal_params, literal_params_ast
from streamer.decode.otlp import _bad_id, _parse, _pick, _salvage, _value

# Keys the decoder keeps (current, older and configured names) and a few it skips.
KEYS = [
    "http.route", "http.response.status_code", "http.status_code", "code.function.name", "code.function",
    "code.namespace", "code.file.path", "code.filepath", "code.line.number", "code.lineno", "db.system.name",
    "db.system", "db.query.text", "db.statement", "db.namespace", "db.name", "db.collection.name", "db.sql.table",
    "db.operation.name", "db.operation", "db.statement.parameters", "db.transaction.id", "db.row.version",
    "app.idempotency_key", "db.query.parameter.0", "db.query.parameter.1", "db.query.parameter.12",
    "db.query.parameter.name", "url.path", "server.address", "exception.type", "exception.message", "service.name",
]  # fmt: skip
PARAM_TEXTS = ["('paid', 8812)", "(1, 2.5, None, True, 'x y')", "[3, -1]", "(007,)", "{'a': 1}", "((1, 2), b'x')",
               "('a\\'b',)", "()", "(1)", "('paid', "]  # fmt: skip

_text = st.text(st.characters(codec="utf-8"), max_size=40) | st.sampled_from(PARAM_TEXTS)
_scalars = st.one_of(
    _text.map(lambda s: AnyValue(string_value=s)),
    st.integers(-(2**63), 2**63 - 1).map(lambda i: AnyValue(int_value=i)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    st.floats(allow_nan=False).map(lambda f: AnyValue(double_value=f)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
)


def _array(values: list[AnyValue]) -> AnyValue:
    av = AnyValue()
    av.array_value.values.extend(values)
    return av


def _kvlist(pairs: list[tuple[str, AnyValue]]) -> AnyValue:
    av = AnyValue()
    av.kvlist_value.values.extend([KeyValue(key=k, value=v) for k, v in pairs])
    return av


_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3).map(_array)
        | st.lists(st.tuples(st.sampled_from([*KEYS[:4], "k"]), inner), max_size=3).map(_kvlist)
    ),
    max_leaves=6,
)
_attributes = st.lists(st.tuples(st.sampled_from(KEYS), _values), max_size=12)  # duplicates included
_ids = st.binary(min_size=16, max_size=16)


@st.composite
def _span(draw: st.DrawFn) -> PbSpan:
    sp = PbSpan(
        trace_id=draw(st.sampled_from([b"\x01" * 16, b"\x02" * 16]) | _ids),
        span_id=draw(st.binary(min_size=8, max_size=8)),
        parent_span_id=draw(st.just(b"") | st.binary(min_size=8, max_size=8)),
        name=draw(st.text(max_size=10)),
        kind=draw(st.integers(0, 7)),
        start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
        end_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
    )
    sp.status.code = draw(st.integers(0, 3))
    sp.attributes.extend([KeyValue(key=k, value=v) for k, v in draw(_attributes)])
    for name in draw(st.lists(st.sampled_from(["exception", "log", ""]), max_size=3)):
        sp.events.add(name=name).attributes.extend([KeyValue(key=k, value=v) for k, v in draw(_attributes)])
    for trace_id in draw(st.lists(_ids, max_size=2)):
        sp.links.add(trace_id=trace_id, span_id=b"\x03" * 8)
    return sp


@st.composite
def _message(draw: st.DrawFn) -> bytes:
    msg = TracesData()
    for _ in range(draw(st.integers(0, 2))):
        rs = msg.resource_spans.add()
        rs.resource.attributes.extend([KeyValue(key=k, value=v) for k, v in draw(_attributes)])
        for _ in range(draw(st.integers(0, 2))):
            rs.scope_spans.add().spans.extend(draw(st.lists(_span(), max_size=4)))
    return bytes(msg.SerializeToString())


def _upb_detail(ext: Extractor, sp: PbSpan) -> SpanDetail:
    """A span's detail read from upb's objects (each attribute's ``KeyValue``), as the decoder read it before it read
    attributes from their bytes (issue 37)."""
    vals: list[Any] | None = None
    for kv in sp.attributes:
        slot = ext.keys.get(kv.key)
        if slot is not None:
            vals = vals or [None] * SPAN_SLOTS
            av = kv.value
            v = av.string_value or _value(av)
            if slot in TEXT_SLOTS and av.WhichOneof("value") == "bytes_value":
                v = av.bytes_value.decode("utf-8", "replace")
            if type(v) is str:
                v = ext.clip(v) if len(v) > ext.quarter else intern(v) if slot in INTERNED_SLOTS else v
            vals[slot] = v
    fields = NO_FIELDS if vals is None else ext.span_fields(vals)
    params = ((kv.key[len(QUERY_PARAM) :], _value(kv.value)) for kv in sp.attributes
              if kv.key.startswith(QUERY_PARAM))  # fmt: skip
    db = ext.db_call(vals, params) if vals and is_db(vals) else None
    exc = [""] * 3
    for ev in sp.events:
        if ev.name == EXCEPTION_EVENT:
            picked = _pick(ev.attributes, EXCEPTION_KEYS)
            if picked is not None:
                exc = [ext.text(v) for v in picked]
            break
    links = tuple(link.trace_id.hex() for link in sp.links)
    return SpanDetail(fields[0], fields[1], exc[0], exc[1], fields[2], fields[3], fields[4], db, links, fields[5],
                      exc[2], sampling_of(sp.trace_state, vals))  # fmt: skip


def _eager_decode(data: bytes, opts: DecodeOptions, stats: DecodeStats | None) -> list[Span]:
    """The decoder before lazy reads: every span's detail read, and its truncations counted, as it is decoded (the
    span's name is bounded like an attribute)."""
    try:
        msg = _parse(TracesData, data, opts)
    except DecodeError as exc:  # a message upb refuses whole is read span by span, as the lazy decoder does
        salvaged = _salvage(data, stats) if exc.reason == "otlp_proto_invalid" else None
        if salvaged is None:
            raise
        msg = salvaged[0]
    ext = Extractor(opts, stats)
    out: list[Span] = []
    for rs in msg.resource_spans:
        resource = ext.resource(_pick(rs.resource.attributes, RESOURCE_KEYS))
        for ss in rs.scope_spans:
            for sp in ss.spans:
                for what, value, size in (("trace_id", sp.trace_id, 16), ("span_id", sp.span_id, 8)):
                    if len(value) != size:
                        raise _bad_id(what, value)
                if sp.parent_span_id and len(sp.parent_span_id) != 8:
                    raise _bad_id("parent_span_id", sp.parent_span_id)
                for link in sp.links:
                    if len(link.trace_id) != 16:
                        raise _bad_id("link trace_id", link.trace_id)
                d = _upb_detail(ext, sp)
                out.append(Span(sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex(), ext.clip(sp.name),
                                KINDS.get(sp.kind, SpanKind.UNSPECIFIED), sp.start_time_unix_nano,
                                sp.end_time_unix_nano, STATUSES.get(sp.status.code, StatusCode.UNSET), resource,
                                d.route, d.http_status, d.exception_type, d.exception_message, d.code_function,
                                d.code_file, d.code_line, d.db, d.links, d.idempotency_key,
                                d.exception_stacktrace))  # fmt: skip
    if stats is not None:
        stats.spans += len(out)
    return out


def _outcome(decode: Any, data: bytes, opts: DecodeOptions) -> tuple[Any, ...]:
    stats = DecodeStats()
    try:
        spans = decode(data, opts, stats)
    except DecodeError as err:
        return ("refused", err.reason)
    return ("spans", [(repr(s), s) for s in spans], stats.spans, stats.truncated_attributes)


@settings(max_examples=300, deadline=None)
@given(_message(), st.sampled_from([16, 64, 300, 600, 1200, 65536]))
def test_lazy_decoder_matches_eager(data: bytes, limit: int) -> None:
    """On varied messages (every kept key, every value type, duplicates, events, links), spans and counts match
    those read from upb's spans."""
    opts = DecodeOptions(max_attribute_bytes=limit)
    assert _outcome(decode_traces_proto, data, opts) == _outcome(_eager_decode, data, opts)


@settings(max_examples=200, deadline=None)
@given(_message(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_lazy_decoder_refuses_like_eager(data: bytes, edits: list[tuple[int, int]]) -> None:
    """A corrupted message is refused with the same reason, or gives the same spans."""
    raw = bytearray(data or b"\x0a\x00")
    for at, byte in edits:
        raw[at % len(raw)] = byte
    opts = DecodeOptions(max_attribute_bytes=64)
    assert _outcome(decode_traces_proto, bytes(raw), opts) == _outcome(_eager_decode, bytes(raw), opts)


def test_bench_messages_match_eager() -> None:
    """The bench's generated shop traffic decodes to the same spans lazily and eagerly, at the default bound."""
    opts = DecodeOptions()
    for data in generate(3_000, 300, seed=7, start_ns=1_700_000_000_000_000_000):
        assert decode_traces_proto(data, opts) == _eager_decode(data, opts, None)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False)
        | st.text(st.characters(codec="utf-8"), max_size=12),
        max_size=6,
    ),
    st.booleans(),
)
def test_literal_params_match_ast(values: list[Any], as_list: bool) -> None:
    """A repr'd tuple or list of scalars parses to the same values (and types) as ``ast.literal_eval`` gives."""
    text = repr(values if as_list else tuple(values))
    got = literal_params(text)
    assert got == literal_params_ast(text)
    assert [type(v) for v in got[0]] == [type(v) for v in literal_params_ast(text)[0]]


@pytest.mark.parametrize(
    "text", ["(1, 2)", "(1)", "(007,)", "(1e5,)", "(0x1,)", "(1_0,)", "(.5,)", "(1.,)", "[1,2]", "('a', ", "(-0,)",
             "('x', 'y'", "(None, Nonesuch)", "((1,),)", "{'a': 1}", "( 1, 2 )", "'a'", "", "(1,,)"],
)  # fmt: skip
def test_literal_params_edge_shapes(text: str) -> None:
    """Shapes near the pattern's edge parse exactly as ``ast.literal_eval`` parses them."""
    assert literal_params(text) == literal_params_ast(text)


def test_parameters_with_invalid_escapes_parse_without_warnings() -> None:
    """Production text such as ``('C:\\eval', {})`` is parsed by ``ast`` without the warning Python raises for an
    invalid escape sequence (the fuzz test printed one; under ``-W error`` the parameters were lost)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert literal_params(r"('a\e', {})") == (("a\\e", "{}"), ())


def test_lazy_span_is_a_frozen_span() -> None:
    """A lazily read span equals, hashes, prints and pickles like the eagerly built one, and is frozen."""
    data = generate(300, 300, seed=3, start_ns=1_700_000_000_000_000_000)[0]
    lazy, eager = decode_traces_proto(data)[0], _eager_decode(data, DecodeOptions(), None)[0]
    assert type(lazy) is Span and lazy == eager and hash(lazy) == hash(eager) and repr(lazy) == repr(eager)
    assert pickle.loads(pickle.dumps(lazy)) == eager
    with pytest.raises(AttributeError):
        lazy.route = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        lazy.trace_id = "x"  # type: ignore[misc]
    assert isinstance(lazy.resource, Resource)


def test_open_traces_hold_one_copy_of_each_id_name_and_code_location() -> None:
    """Spans kept in open traces share their text: a parent's span id and its children's parent id are one string
    (within a message), and span names, routes, code locations and statements are one string per value."""
    spans = decode_traces_proto(generate(600, 300, seed=3)[0])
    by_id = {s.span_id: s for s in spans}
    children = [s for s in spans if s.parent_id in by_id]
    assert children and all(s.parent_id is by_id[s.parent_id].span_id for s in children)
    for field in ("name", "route", "code_function", "code_file"):
        values = [getattr(s, field) for s in spans if getattr(s, field)]
        first: dict[str, str] = {}
        assert values and all(first.setdefault(v, v) is v for v in values), field
    statements = [s.db.statement for s in spans if s.db is not None]
    first_sql: dict[str, str] = {}
    assert statements and all(first_sql.setdefault(v, v) is v for v in statements)


def test_spans_with_the_same_route_or_code_location_share_one_detail() -> None:
    """Most spans' detail is a route or a code location, the same few everywhere: one tuple each is shared (it is
    immutable); a span with anything of its own (a statement, an exception) has its own."""
    spans = decode_traces_proto(generate(600, 300, seed=3)[0])
    routes: dict[tuple[str, int], Any] = {}
    shared = [s for s in spans if s.route and s.db is None and not s.exception_type]
    assert shared and all(routes.setdefault((s.route, s.http_status), s.detail) is s.detail for s in shared)
    own = [s for s in spans if s.db is not None]
    assert own and len({id(s.detail) for s in own}) == len(own)


def test_large_scopes_of_small_spans_and_a_large_span_match_eager() -> None:
    """A scope larger than the size a span is looked at (its spans then sized one by one) holding only small spans,
    and one holding a span large enough to be cut: the large span's cut is counted, as the eager decoder counts it."""
    msg = TracesData()
    rs = msg.resource_spans.add()
    small_scope, large_scope = rs.scope_spans.add(), rs.scope_spans.add()
    for i in range(40):
        for scope in (small_scope, large_scope):
            sp = scope.spans.add(trace_id=b"\x01" * 16, span_id=bytes([i + 1]) * 8, name="s", start_time_unix_nano=1)
            sp.attributes.add(key="http.route", value=AnyValue(string_value="/r"))
    big = large_scope.spans[7]
    big.attributes.add(key="code.file.path", value=AnyValue(string_value="f" * 500))
    data = msg.SerializeToString()
    opts = DecodeOptions(max_attribute_bytes=64)  # a span of over 6 bytes is sized: each scope is larger
    assert _outcome(decode_traces_proto, data, opts) == _outcome(_eager_decode, data, opts)
    assert _outcome(decode_traces_proto, data, opts)[3] == 1
