"""Values many messages share are decoded once and held once: a service's resource (one trace per message, as the
Collector's kafka exporter writes them, repeats it in every message), within a bound whose resets are counted."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.api.telemetry import Telemetry
from streamer.decode import DecodeOptions, DecodeStats, decode_traces_proto, otlp
from streamer.decode.config import DecodeConfig
from streamer.decode.registry import DECODERS, Record


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
    """Past ``SHARED_RESOURCES`` distinct resources the cache starts again; the span decoder counts each reset."""
    telemetry = Telemetry("decode")
    decode = DECODERS["otlp_proto.traces"](DecodeConfig(), telemetry)
    before = otlp.shared_resets()
    for i in range(otlp.SHARED_RESOURCES + 1):
        decode(Record("otlp_spans", 0, i, None, _message(f"svc-{i}", i + 1)))
    assert otlp.shared_resets() > before
    decode(Record("otlp_spans", 0, 0, None, _message("svc-0", 7)))
    assert telemetry.dropped["shared_cache_reset"] == otlp.shared_resets() - before
    assert len(otlp._RESOURCES.data) <= otlp.SHARED_RESOURCES
