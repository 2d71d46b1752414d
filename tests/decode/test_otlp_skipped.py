"""Skipped attributes known by their bytes (``KeptAttributes.skipped``) are known under one set of decode options:
an attribute that one set skips is read under another that keeps its key, and a span reads the same with its
skipped attributes known or not."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from streamer.decode._attrs import DecodeOptions
from streamer.decode._lite import SKIPPED_ATTRIBUTES, Shared, kept_attributes
from streamer.decode.otlp import decode_traces_proto


def _message(key: str) -> bytes:
    msg = TracesData()
    span = (
        msg.resource_spans.add()
        .scope_spans.add()
        .spans.add(trace_id=b"\x07" * 16, span_id=b"\x01" * 8, name="op", kind=2, start_time_unix_nano=1)
    )
    for k, v in (("server.address", "db"), ("http.route", "/pay"), (key, "k-1")):
        span.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    return bytes(msg.SerializeToString())


def test_an_attribute_skipped_under_one_set_of_options_is_read_under_another() -> None:
    data = _message("shop.request_key")
    plain, keyed = DecodeOptions(), DecodeOptions(idempotency_key_attribute="shop.request_key")
    for _ in range(2):  # the second time, its bytes are known skipped under ``plain``
        [span] = decode_traces_proto(data, plain)
        assert (span.route, span.idempotency_key) == ("/pay", "")
    assert kept_attributes(plain).skipped.data  # server.address, shop.request_key
    for _ in range(2):
        [span] = decode_traces_proto(data, keyed)
        assert (span.route, span.idempotency_key) == ("/pay", "k-1")


def test_the_known_skipped_start_again_past_the_bound() -> None:
    resets = Shared.total
    opts = DecodeOptions(idempotency_key_attribute="bound.key")
    for i in range(SKIPPED_ATTRIBUTES + 10):
        [span] = decode_traces_proto(_message(f"other.{i}"), opts)
        assert span.route == "/pay"
    skipped = kept_attributes(opts).skipped
    assert 0 < len(skipped.data) <= SKIPPED_ATTRIBUTES
    assert Shared.total - resets >= 1
    assert skipped.resets == 1  # counted, as every shared cache's reset (dropped{decode, shared_cache_reset})
