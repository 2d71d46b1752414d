"""Values many messages share are decoded once and held once: a service's resource (one trace per message, as the
Collector's kafka exporter writes them, repeats it in every message), within a bound whose resets are counted."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.api.telemetry import Telemetry
from processors.model.events import SpanKind, StatusCode
from streamer.decode import DecodeOptions, DecodeStats, decode_traces_proto, otlp
from streamer.decode._attrs import KINDS, STATUSES
from streamer.decode.config import DecodeConfig
from streamer.decode.registry import Input, Inputs, Record


def _message(service: str, trace: int, version: str = "1.0.0") -> bytes:
    msg = TracesData()
    rs = msg.resource_spans.add()
    for key, value in (("service.name", service), ("service.version", version), ("host.name", "h1")):
        rs.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.name = trace.to_bytes(16, "big"), (trace + 1).to_bytes(8, "big"), "GET /"
    sp.start_time_unix_nano, sp.end_time_unix_nano = 1_000, 2_000
    return bytes(msg.SerializeToString())


def test_one_resource_object_for_every_message_of_a_service() -> None:
    """Two messages of the same service share one ``Resource``; another version is another one, equal to what a
    fresh decode gives."""
    a = decode_traces_proto(_message("checkout", 1))[0].resource
    b = decode_traces_proto(_message("checkout", 2))[0].resource
    c = decode_traces_proto(_message("checkout", 3, version="1.1.0"))[0].resource
    assert a is b
    assert (
        c is not a
        and (c.service, c.version) == ("checkout", "1.1.0")
        and (a.service, a.version)
        == (
            "checkout",
            "1.0.0",
        )
    )


def test_a_resource_cut_by_the_bound_is_counted_in_every_message() -> None:
    """A resource whose value is cut is not shared: each message carrying it counts its cut (and the ``dlq`` policy
    refuses each), as without the cache."""
    opts = DecodeOptions(max_attribute_bytes=64)
    long_name = "s" * 300
    for trace in (1, 2, 3):
        stats = DecodeStats()
        spans = decode_traces_proto(_message(long_name, trace), opts, stats)
        assert stats.truncated_attributes == 1 and len(spans[0].resource.service.encode()) <= 64


def test_the_bound_starts_again_and_is_counted() -> None:
    """Past ``SHARED_RESOURCES`` distinct resources the cache starts again; the span decoder counts each reset, once
    a batch (at ``Inputs.batch_done``, which a stage calls after a batch's records)."""
    telemetry = Telemetry("decode")
    inputs = Inputs([Input("spans", "otlp_proto.traces", topics=("otlp_spans",))], DecodeConfig(), lambda _: telemetry)
    source = inputs.lookup("otlp_spans")
    assert source is not None
    before = otlp.shared_resets()
    for i in range(otlp.SHARED_RESOURCES + 1):
        inputs.decode(source, Record("otlp_spans", 0, i, None, _message(f"svc-{i}", i + 1)))
    assert otlp.shared_resets() > before
    assert telemetry.dropped["shared_cache_reset"] == 0  # not yet: the batch goes on
    inputs.batch_done()
    assert telemetry.dropped["shared_cache_reset"] == otlp.shared_resets() - before
    inputs.decode(source, Record("otlp_spans", 0, 0, None, _message("svc-0", 7)))
    inputs.batch_done()
    assert telemetry.dropped["shared_cache_reset"] == otlp.shared_resets() - before
    assert len(otlp._RESOURCES.data) <= otlp.SHARED_RESOURCES


def _kv(key: str, value: str) -> bytes:
    return bytes(KeyValue(key=key, value=AnyValue(string_value=value)).SerializeToString())


def _field(number: int, raw: bytes) -> bytes:
    """A length-delimited field, encoded by hand (a serializer would write a KeyValue in its usual order)."""
    size, n = b"", len(raw)
    while n >= 128:
        size, n = size + bytes((n & 127 | 128,)), n >> 7
    return bytes((number << 3 | 2,)) + size + bytes((n,)) + raw


def _with_attributes(*encoded: bytes, trace: int = 9, extra: bytes = b"") -> bytes:
    """A one-span message whose attributes are ``encoded`` as given (field 9 of the span, in this order), then the
    encoded span fields ``extra``."""
    msg = TracesData.FromString(_message("svc", trace))
    rs = msg.resource_spans[0]
    sp = bytes(rs.scope_spans[0].spans[0].SerializeToString()) + b"".join(_field(9, kv) for kv in encoded) + extra
    return _field(1, _field(1, bytes(rs.resource.SerializeToString())) + _field(2, _field(2, sp)))


def test_an_attribute_encoded_out_of_the_usual_order_reads_as_upb_reads_it() -> None:
    """A ``KeyValue`` is read from its bytes, a key the detail does not keep skipped by its key field: one whose key
    field is repeated (the last wins), comes after its value or holds no value reads as upb reads it."""
    route = _kv("http.route", "/orders")
    key_only = _field(1, b"http.route")  # a KeyValue of no value
    value_first = _kv("", "/late") + key_only  # the value field, then the key
    repeated_key = _field(1, b"url.path") + route  # a skipped key, then a kept one
    key_last = _kv("url.path", "/last") + key_only  # a skipped key and its value, then a kept key
    for attrs, expected in (((route,), "/orders"), ((value_first,), "/late"), ((repeated_key,), "/orders"),
                            ((key_last,), "/last"), ((route, key_only), "")):  # fmt: skip
        upb = TracesData.FromString(_with_attributes(*attrs)).resource_spans[0].scope_spans[0].spans[0]
        assert {kv.key: kv.value.string_value for kv in upb.attributes}["http.route"] == expected
        [span] = decode_traces_proto(_with_attributes(*attrs))
        assert span.route == expected, attrs


def test_a_kept_attribute_is_read_once_for_each_set_of_options() -> None:
    """The same attribute under options with a smaller ``max_attribute_bytes`` is cut (and counted) in every message
    that carries it, though it was read whole, and kept, under the defaults."""
    statement = _kv("db.query.text", "SELECT " + "x, " * 40 + "y FROM t")  # under 256 bytes: kept
    system = _kv("db.system.name", "postgresql")
    assert decode_traces_proto(_with_attributes(system, statement))[0].db.statement.endswith("FROM t")  # type: ignore[union-attr]
    small = DecodeOptions(max_attribute_bytes=64)
    for trace in (1, 2):
        stats = DecodeStats()
        [span] = decode_traces_proto(_with_attributes(system, statement, trace=trace), small, stats)
        assert stats.truncated_attributes == 1 and span.db is not None and len(span.db.statement) == 64


def test_a_span_with_the_kept_attributes_of_another_has_its_own_events_links_and_trace_state() -> None:
    """Spans of the same kept attributes (byte for byte) share one detail; one that also has an exception event, a
    link or a trace state, or another kept attribute, has its own."""
    route, status = _kv("http.route", "/pay"), _kv("http.response.status_code", "500")
    plain = [decode_traces_proto(_with_attributes(route, status, trace=t))[0] for t in (11, 12, 13)]
    assert plain[1].detail is plain[2].detail and (plain[2].route, plain[2].http_status) == ("/pay", 500)
    event = PbSpan.Event(
        name="exception", attributes=[KeyValue(key="exception.type", value=AnyValue(string_value="E"))]
    )
    link = PbSpan.Link(trace_id=(7).to_bytes(16, "big"), span_id=(8).to_bytes(8, "big"))
    for extra, check in ((_field(11, event.SerializeToString()), lambda s: s.exception_type == "E"),
                         (_field(13, link.SerializeToString()), lambda s: s.links == ((7).to_bytes(16, "big").hex(),)),
                         (_field(3, b"ot=th:8"), lambda s: s.sampling != plain[0].sampling),
                         (_field(9, _kv("http.route", "/other")), lambda s: s.route == "/other")):  # fmt: skip
        [span] = decode_traces_proto(_with_attributes(route, status, trace=14, extra=extra))
        assert check(span) and span.http_status == 500, extra


def test_an_exception_message_alone_is_kept() -> None:
    """A span whose only detail is its exception event's message keeps it (it was read, then dropped as no detail)."""
    attrs = [KeyValue(key="exception.message", value=AnyValue(string_value="boom"))]
    event = _field(11, PbSpan.Event(name="exception", attributes=attrs).SerializeToString())
    [span] = decode_traces_proto(_with_attributes(trace=21, extra=event))
    assert (span.exception_type, span.exception_message) == ("", "boom")


def test_a_resource_given_twice_is_merged_as_upb_merges_it() -> None:
    """A ``ResourceSpans`` whose resource field comes twice decodes to upb's merge of both (the shared resource is
    found by the bytes of each, joined), not to the shared resource of either alone."""
    span = TracesData.FromString(_message("svc", 11)).resource_spans[0].scope_spans[0].spans[0]
    sp = _field(2, bytes(span.SerializeToString()))
    first = _field(1, _kv("service.name", "first-only"))
    second = _field(1, _kv("service.version", "9.9.9"))
    alone = [decode_traces_proto(_field(1, _field(1, r) + _field(2, sp)))[0].resource for r in (first, second)]
    assert [(r.service, r.version) for r in alone] == [("first-only", ""), ("", "9.9.9")]  # each now shared
    resource = decode_traces_proto(_field(1, _field(1, first) + _field(1, second) + _field(2, sp)))[0].resource
    assert (resource.service, resource.version) == ("first-only", "9.9.9")


def _varint(number: int, value: int) -> bytes:
    out, v = bytes((number << 3,)), value & (1 << 64) - 1
    while v >= 128:
        out, v = out + bytes((v & 127 | 128,)), v >> 7
    return out + bytes((v,))


def test_core_fields_given_oddly_read_as_upb_reads_them() -> None:
    """A span's core fields are read from the lite parse as upb reads them: a kind or status code out of range or
    negative, fields repeated (the last wins; the status given twice is merged), a time sent as a varint (another
    wire type: an unknown field to both, so the time stays as it was)."""
    extras = [
        _varint(6, 99),
        _varint(6, -3),
        _varint(6, 2) + _varint(6, 3),
        _varint(7, 5),
        _field(15, _varint(3, 2)) + _field(15, b"\x12\x01x"),
        _field(15, _varint(3, 7)),
        _field(15, _varint(3, -1)),
        _field(5, b"renamed") + _varint(8, 1),
    ]
    for extra in extras:
        data = _with_attributes(trace=31, extra=extra)
        upb = TracesData.FromString(data).resource_spans[0].scope_spans[0].spans[0]
        [span] = decode_traces_proto(data)
        expected = (KINDS.get(upb.kind, SpanKind.UNSPECIFIED), STATUSES.get(upb.status.code, StatusCode.UNSET))
        assert (span.kind, span.status) == expected, extra
        assert (span.name, span.start_ns, span.end_ns) == (upb.name, upb.start_time_unix_nano, upb.end_time_unix_nano)
