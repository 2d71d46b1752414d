"""A span whose attributes (all of them, byte for byte, in order) an earlier span of no events, links nor trace
state had, each known then, is given that span's detail in one lookup (``KeptAttributes.spans``); and a span's
detail is read as it is decoded. Both give what the general path gives: compared here with the eager oracle of
``test_otlp_lazy`` on generated, hostile and bench messages, each decoded three times (cold, its attributes known,
its whole attributes known)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

import streamer.decode.otlp
from bench.otlp_gen import generate
from processors.model.span import NO_DETAIL, Span, read_details
from streamer.decode import DecodeOptions, decode_traces_proto
from streamer.decode._detail import SPAN_KEY_BYTES
from streamer.decode._lite import KNOWN_SPANS, Shared, kept_attributes
from tests.decode.test_otlp_lazy import _eager_decode, _message, _outcome


@settings(max_examples=300, deadline=None)
@given(_message(), st.sampled_from([16, 64, 300, 600, 1200, 65536]))
def test_a_span_read_from_its_known_attributes_reads_as_the_eager_decoder(data: bytes, limit: int) -> None:
    """On varied messages (every kept key, every value type, duplicates, events, links), the first, second and
    third decode of a message give the spans and counts of the eager decoder."""
    opts = DecodeOptions(max_attribute_bytes=limit)
    expected = _outcome(_eager_decode, data, opts)
    for _ in range(3):
        assert _outcome(decode_traces_proto, data, opts) == expected


def _kv(key: str, value: Any) -> KeyValue:
    av = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
    return KeyValue(key=key, value=av)


def _framed(raw: bytes, number: int) -> bytes:
    """A length-delimited field, encoded by hand."""
    size, n = b"", len(raw)
    while n >= 128:
        size, n = size + bytes((n & 127 | 128,)), n >> 7
    return bytes((number << 3 | 2,)) + size + bytes((n,)) + raw


def _one_span(attributes: list[bytes], trace: int, extra: PbSpan | None = None) -> bytes:
    """A one-span message whose span's attributes are the encoded ``attributes`` (as given, so in any form)."""
    sp = PbSpan()
    if extra is not None:
        sp.CopyFrom(extra)
    sp.trace_id, sp.span_id, sp.name = trace.to_bytes(16, "big"), (trace + 1).to_bytes(8, "big"), "GET /"
    sp.start_time_unix_nano, sp.end_time_unix_nano = 1_000, 2_000
    raw = bytes(sp.SerializeToString()) + b"".join(_framed(a, 9) for a in attributes)
    return _framed(_framed(_framed(raw, 2), 2), 1)  # TracesData.resource_spans.scope_spans.spans


ROUTE = _kv("http.route", "/pay").SerializeToString()
STATUS = _kv("http.response.status_code", 502).SerializeToString()
OTHER = _kv("server.address", "db").SerializeToString()
KEY_LAST = b"\x12\x06\n\x04/odd\n\nhttp.route"  # a KeyValue of its value first: upb reads it as well
TWICE = b"\n\nhttp.route\x12\x06\n\x04/one\n\nhttp.route\x12\x06\n\x04/two"  # the last key and value win


def test_hostile_attributes_known_whole_read_as_upb_reads_them() -> None:
    """Attributes out of the usual order, given twice in one ``KeyValue``, repeated, or in another order: each
    message three times, every time what the eager decoder reads, and the whole attributes then known."""
    opts = DecodeOptions(idempotency_key_attribute="known.spans.hostile")
    lists = [[ROUTE, STATUS, OTHER], [OTHER, STATUS, ROUTE], [KEY_LAST, OTHER], [TWICE], [ROUTE, ROUTE, OTHER],
             [OTHER], [], [STATUS, KEY_LAST, TWICE]]  # fmt: skip
    for n, attributes in enumerate(lists):
        data = _one_span([bytes(a) for a in attributes], 40 + n)
        expected = _eager_decode(data, opts, None)
        for _ in range(3):
            assert decode_traces_proto(data, opts) == expected, attributes
    known = kept_attributes(opts).spans.data
    assert tuple(bytes(a) for a in lists[0]) in known and tuple(bytes(a) for a in lists[2]) in known
    assert known[()] is NO_DETAIL and known[(bytes(OTHER),)] is NO_DETAIL


def test_a_span_with_events_links_or_a_trace_state_is_not_given_the_known_detail() -> None:
    """The attributes of a known plain span, with an exception event, a link or a trace state: its own detail."""
    opts = DecodeOptions(idempotency_key_attribute="known.spans.extra")
    attributes = [bytes(ROUTE), bytes(STATUS)]
    for trace in (50, 51, 52):
        [plain] = decode_traces_proto(_one_span(attributes, trace), opts)
    assert tuple(attributes) in kept_attributes(opts).spans.data
    event = PbSpan(events=[PbSpan.Event(name="exception", attributes=[_kv("exception.type", "E")])])
    link = PbSpan(links=[PbSpan.Link(trace_id=(7).to_bytes(16, "big"), span_id=(8).to_bytes(8, "big"))])
    for extra, field in ((event, "exception_type"), (link, "links"), (PbSpan(trace_state="ot=th:8"), "sampling")):
        data = _one_span(attributes, 53, extra)
        [span] = decode_traces_proto(data, opts)
        [expected] = _eager_decode(data, opts, None)  # (which reads no trace state: sampling left out)
        assert span.detail._replace(sampling=expected.sampling) == expected.detail
        assert getattr(span, field) != getattr(plain, field)
        assert (span.route, span.http_status) == ("/pay", 502)


def test_only_spans_whose_attributes_were_each_known_are_known_whole() -> None:
    """A span with an attribute seen for the first time (an id in a URL) is not kept whole: only repeated ones
    are; nor one whose attributes take more than ``SPAN_KEY_BYTES``."""
    opts = DecodeOptions(idempotency_key_attribute="known.spans.fresh")
    known = kept_attributes(opts).spans.data
    for i in range(20):
        decode_traces_proto(_one_span([bytes(ROUTE), bytes(_kv("url.path", f"/p/{i}").SerializeToString())], 60), opts)
    assert not known
    big = [bytes(_kv("server.address", f"{i:03d}" + "x" * 100).SerializeToString()) for i in range(11)]
    assert sum(map(len, big)) > SPAN_KEY_BYTES
    for _ in range(3):
        decode_traces_proto(_one_span(big, 61), opts)
    assert not known
    for _ in range(2):
        decode_traces_proto(_one_span(big[:5], 62), opts)
    assert tuple(big[:5]) in known


def test_the_known_spans_start_again_past_the_bound() -> None:
    resets = Shared.total
    opts = DecodeOptions(idempotency_key_attribute="known.spans.bound")
    for i in range(KNOWN_SPANS + 10):
        data = _one_span([bytes(ROUTE), bytes(_kv("other.key", str(i)).SerializeToString())], 70)
        for _ in range(2):  # the second time, each of its attributes is known
            [span] = decode_traces_proto(data, opts)
            assert span.route == "/pay"
    spans = kept_attributes(opts).spans
    assert 0 < len(spans.data) <= KNOWN_SPANS
    assert spans.resets == 1 and Shared.total - resets >= 1  # counted, as every shared cache's reset


def test_bench_messages_read_as_the_eager_decoder_three_times() -> None:
    opts = DecodeOptions(idempotency_key_attribute="known.spans.bench")
    messages = generate(3_000, 300, seed=11, start_ns=1_700_000_000_000_000_000)
    for _ in range(3):
        for data in messages:
            assert decode_traces_proto(data, opts) == _eager_decode(data, opts, None)
    assert kept_attributes(opts).spans.data


def test_spans_are_read_as_they_are_decoded_and_one_that_raises_is_left_lazy(monkeypatch: Any) -> None:
    """Decoded spans hold their detail, not their message's parse; a span whose detail raises as it is decoded is
    read on first use (and the stage refuses it then, alone: ``tests/runtime/test_containment``)."""
    data = generate(300, 300, seed=3, start_ns=1_700_000_000_000_000_000)[0]
    expected = _eager_decode(data, DecodeOptions(), None)
    spans = decode_traces_proto(data)
    assert all(s._source is None and s._reader is None and type(s) is Span for s in spans)
    real, target, raised = streamer.decode.otlp._span_detail, bytes.fromhex(spans[2].span_id), []

    def once(ext: Any, sp: Any, links: Any = None) -> Any:  # raises the first time it reads the third span
        if sp.span_id == target and not raised:
            raised.append(target)
            raise RuntimeError("as it is decoded")
        return real(ext, sp, links)

    monkeypatch.setattr(streamer.decode.otlp, "_span_detail", once)
    spans = decode_traces_proto(data)
    assert [s._source is not None for s in spans[:4]] == [False, False, True, False]
    read_details(spans)
    assert spans == expected


def test_a_db_call_of_no_value_of_its_own_is_read_once_for_its_kept_attributes() -> None:
    """DB spans of the same kept attributes (system, statement ...) and no value of their own (parameters,
    transaction id, row version, idempotency key, ``db.query.parameter.*``) are given one detail, as the eager
    decoder reads it; a span that carries such a value, or a query parameter, gets its own."""
    opts = DecodeOptions(idempotency_key_attribute="known.spans.db")
    db = [bytes(_kv(k, v).SerializeToString()) for k, v in (("db.system.name", "postgresql"),
                                                            ("db.query.text", "SELECT 1 WHERE id = %s"))]  # fmt: skip
    details = []
    for i in range(4):
        own = {1: [_kv("db.statement.parameters", f"({i},)")], 2: [_kv("db.query.parameter.0", i)]}.get(i, [])
        unique = [bytes(_kv("url.path", f"/x/{i}").SerializeToString())]  # never two spans' attributes the same
        data = _one_span(db + unique + [bytes(kv.SerializeToString()) for kv in own], 60 + 2 * i)
        for _ in range(2):
            spans = decode_traces_proto(data, opts)
            assert spans == _eager_decode(data, opts, None)
            details.append(spans[0].detail)
    first = details[1]  # the first read is of attributes not known yet: the second is kept
    assert first.db is not None and first.db.params == () and details[0] == first
    assert details[6] is first and details[7] is first
    assert details[2].db is not None and details[2].db.params == (1,) and details[2] is not details[3]
    assert details[4].db is not None and details[4].db.params == (2,) and details[4] is not details[5]
