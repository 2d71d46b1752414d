"""Kept versus represented traffic per service and version, and its export on the daemon's Prometheus registry."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processors.model.events import Resource, SpanKind, StatusCode
from processors.model.sampling import UNKNOWN, Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.requests import requests_of
from processors.pipeline.sampled_traffic import SampledTraffic, trace_sampling
from streamer.runtime.metrics import Metrics

HALF = Sampling(0.5, "tracestate")
TENTH = Sampling(0.1, "jaeger")


def _trace(n: int, version: str, root: Sampling, child: Sampling = UNKNOWN, service: str = "checkout") -> ClosedTrace:
    res = Resource(service, version, "test", "")
    tid = f"{n:032x}"
    server, client = f"{n:015x}1", f"{n:015x}2"
    spans = (Span(tid, server, "", "GET /", SpanKind.SERVER, 1, 2, StatusCode.UNSET, res, sampling=root),
             Span(tid, client, server, "q", SpanKind.CLIENT, 1, 2, StatusCode.UNSET, res, sampling=child))  # fmt: skip
    return ClosedTrace(tid, spans)


def test_a_trace_takes_its_roots_sampling_else_the_first_stated() -> None:
    assert trace_sampling(_trace(1, "1", HALF, TENTH)) == HALF
    assert trace_sampling(_trace(2, "1", UNKNOWN, TENTH)) == TENTH
    assert trace_sampling(_trace(3, "1", UNKNOWN)) == UNKNOWN


def test_kept_and_represented_per_build_and_sampling() -> None:
    """Four traces kept at 0.5 represent eight; two at 0.1 twenty; unknown ones represent themselves, apart."""
    traffic = SampledTraffic()
    for n in range(4):
        traffic.add(_trace(n, "1.0", HALF))
    for n in range(2):
        traffic.add(_trace(10 + n, "1.1", TENTH))
    traffic.add(_trace(20, "1.1", UNKNOWN))
    assert traffic.kept == {("checkout", "1.0", "0.5"): 4, ("checkout", "1.1", "0.1"): 2,
                            ("checkout", "1.1", "unknown"): 1}  # fmt: skip
    assert traffic.represented == {("checkout", "1.0", "0.5"): 8.0, ("checkout", "1.1", "0.1"): 20.0,
                                   ("checkout", "1.1", "unknown"): 1.0}  # fmt: skip


def test_series_are_bounded_and_the_overflow_counted() -> None:
    traffic = SampledTraffic(max_series=2)
    for n, version in enumerate(("1", "2", "3", "3")):
        traffic.add(_trace(n, version, HALF))
    assert len(traffic.kept) == 2 and traffic.telemetry.dropped == {"max_sampled_series": 2}


def test_the_daemons_registry_exports_both_counters() -> None:
    """``trace_repro_traces_kept_total`` and ``trace_repro_traces_represented_total`` {service, version, sampling}."""
    metrics = Metrics()
    metrics.sampled.add(_trace(1, "1.0", HALF))
    metrics.sampled.add(_trace(2, "1.0", HALF))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
               for s in family.samples}  # fmt: skip
    build = (("sampling", "0.5"), ("service", "checkout"), ("version", "1.0"))
    assert samples[("trace_repro_traces_kept_total", build)] == 2
    assert samples[("trace_repro_traces_represented_total", build)] == 4.0
    bound = (("component", "sampling"), ("reason", "max_sampled_series"))
    assert samples[("trace_repro_dropped_total", bound)] == 0  # declared before its first drop


def test_a_request_whose_span_states_no_sampling_takes_its_traces() -> None:
    """Jaeger clients put ``sampler.*`` on the root span only: a server span below it is counted with the trace's."""
    res = Resource("checkout", "1", "test", "")
    tid = "7" * 32
    root = Span(tid, "1" * 16, "", "GET /", SpanKind.SERVER, 1, 9, StatusCode.UNSET, res, sampling=TENTH)
    inner = Span(tid, "2" * 16, root.span_id, "POST /pay", SpanKind.SERVER, 2, 8, StatusCode.UNSET, res)
    assert [r.sampling for r in requests_of(ClosedTrace(tid, (root, inner)))] == [TENTH, TENTH]
    alone = Span("8" * 32, "3" * 16, "", "GET /", SpanKind.SERVER, 1, 9, StatusCode.UNSET, res)
    assert [r.sampling for r in requests_of(ClosedTrace(alone.trace_id, (alone,)))] == [UNKNOWN]
