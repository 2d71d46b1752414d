"""Kept versus represented traffic through the daemon: sampled spans on Kafka show on its Prometheus registry."""

from __future__ import annotations

import time

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines

MS = 1_000_000


def _traces(service: str, version: str, trace_state: str, first: int, n: int, start_ns: int) -> bytes:
    """``n`` one-span traces of ``service`` ``version``, each with ``trace_state``, 10 ms apart."""
    msg = trace_pb2.TracesData()
    rs = msg.resource_spans.add()
    for key, value in (("service.name", service), ("service.version", version)):
        rs.resource.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    spans = rs.scope_spans.add().spans
    for i in range(n):
        sp = spans.add()
        sp.trace_id, sp.span_id = (first + i).to_bytes(16, "big"), (first + i).to_bytes(8, "big")
        sp.name, sp.kind, sp.trace_state = "GET /cart", 2, trace_state
        sp.start_time_unix_nano = start_ns + i * 10 * MS
        sp.end_time_unix_nano = sp.start_time_unix_nano + MS
    return bytes(msg.SerializeToString())


async def test_the_daemon_counts_kept_and_represented_traces(kafka_bootstrap: str, falkordb_url: str) -> None:
    """Four traces kept at 0.5 (``ot=th:8``) represent eight; two without tracestate represent themselves, under
    ``sampling="unknown"``."""
    settings = harness_settings(kafka_bootstrap, falkordb_url, WINDOWS__TRACE_GAP_S="0.2")
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    now = time.time_ns()
    try:
        await h.start()
        await h.produce(settings.kafka.spans_topic, [
            _traces("cart", "2.1", "ot=th:8", 1, 4, now),
            _traces("cart", "2.1", "", 100, 2, now + 50 * MS),
            _traces("clock", "0", "", 200, 1, now + 5_000 * MS),  # moves event time past the others' gap
        ])  # fmt: skip

        def series(name: str) -> dict[str, float]:
            assert h.daemon is not None
            samples = [s for f in h.daemon.metrics.registry.collect() for s in f.samples if s.name == name]
            cart = ("cart", "2.1")
            return {
                s.labels["sampling"]: s.value for s in samples if (s.labels["service"], s.labels["version"]) == cart
            }

        await h.wait_for(lambda: sum(series("trace_repro_traces_kept_total").values()) == 6, "six cart traces")
        assert series("trace_repro_traces_kept_total") == {"0.5": 4, "unknown": 2}
        assert series("trace_repro_traces_represented_total") == {"0.5": 8.0, "unknown": 2.0}
    finally:
        await h.stop()
