"""Windowed service statistics: requests, error signatures, bounded samples, event-time closing, graph rows."""

from __future__ import annotations

import json
import random

from processors.detectors.regressions.stats import Reservoir, ServiceStats, SlowTraces, merge, stats_rows
from processors.model.events import Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.requests import error_signature, operation_key_of, requests_of
from sinks.graph import schema
from tests.regressions.builders import MS, T0, S, request, statement_params

SIZE = 10 * S
GRACE = 2 * S


def test_request_signature_names_route_and_deepest_exception_with_its_function() -> None:
    """A failed request's signature is error:<METHOD route>:<exception>; the function is the handler's."""
    [req] = requests_of(request(T0, "1.0", route="/split/custom", exception="RoundingError"))
    assert (req.service, req.version, req.revision) == ("split", "1.0", "rev-1.0")
    assert (req.operation, req.label) == ("/split/custom", "POST /split/custom")
    assert req.error and req.signature == "error:POST /split/custom:RoundingError"
    assert req.function == "split.handlers.custom"


def test_5xx_without_exception_and_4xx_and_jobs() -> None:
    """A 503 without exception is 'HTTP 503'; a 409 is no error; a root job span is a request named by its span."""
    [r503] = requests_of(request(T0, "1.0", status=503))
    assert r503.signature == "error:POST /split/even:HTTP 503"
    [r409] = requests_of(request(T0, "1.0", status=409))
    assert not r409.error and r409.signature == ""
    job = Span("j" * 32, "1" * 16, "", "job expire_cart", SpanKind.INTERNAL, T0, T0 + MS, StatusCode.ERROR,
               Resource("shop", "2"), code_function="shop.jobs.expire_cart")  # fmt: skip
    [rj] = requests_of(ClosedTrace(job.trace_id, (job,), frozenset()))
    assert (rj.operation, rj.label, rj.signature) == ("job expire_cart", "job expire_cart",
                                                      "error:job expire_cart:error")  # fmt: skip
    assert error_signature("GET /x", "", 0) == "error:GET /x:error"


def test_each_service_of_a_trace_counts_under_its_own_version() -> None:
    """A frontend 2.0 request calling a checkout 1.4 server span counts once for each, under its own version."""
    fe = Span("c" * 32, "a" * 16, "", "GET /buy", SpanKind.SERVER, T0, T0 + 9 * MS, StatusCode.UNSET,
              Resource("frontend", "2.0"), route="/buy")  # fmt: skip
    co = Span("c" * 32, "b" * 16, fe.span_id, "POST /pay", SpanKind.SERVER, T0 + MS, T0 + 8 * MS,
              StatusCode.ERROR, Resource("checkout", "1.4"), route="/pay", http_status=502)  # fmt: skip
    reqs = requests_of(ClosedTrace(fe.trace_id, (fe, co), frozenset()))
    assert {(r.service, r.version, r.error) for r in reqs} == {("frontend", "2.0", False), ("checkout", "1.4", True)}


def test_windows_close_on_the_watermark_and_late_traces_are_counted_out() -> None:
    """Counts per (service, operation, version) appear when end + grace passes; a later trace for it is late."""
    w = ServiceStats(SIZE, GRACE)
    for i in range(10):
        w.add(request(T0 + i * 100 * MS, "1.0", exception="RoundingError" if i < 3 else ""))
    w.add(request(T0 + 2 * S, "1.1"))
    assert w.close_until(T0 + SIZE + GRACE - 1) == []
    assert w.close_until(T0 + SIZE + GRACE, open_since_ns=T0 + 5 * S) == []  # an open trace may still add to it
    [window] = w.close_until(T0 + SIZE + GRACE)
    op = window.ops[("split", "/split/even", "1.0")]
    assert (op.requests, op.errors, op.signatures) == (10, 3, {"error:POST /split/even:RoundingError": 3})
    assert op.sites == {"error:POST /split/even:RoundingError": {"POST /split/even in split.handlers.even": 3}}
    assert window.ops[("split", "/split/even", "1.1")].requests == 1
    assert window.window_id == f"{T0 // MS}-{(T0 + SIZE) // MS}"
    assert w.add(request(T0 + 3 * S, "1.0")) is False
    assert w.telemetry.dropped["stats_late"] == 1


def test_latency_samples_are_bounded_and_drops_counted() -> None:
    """The reservoir keeps at most its size, counts the rest as dropped, and the sketch still sees everything."""
    w = ServiceStats(SIZE, GRACE, reservoir_size=8, slow_traces=4)
    for i in range(50):
        w.add(request(T0 + i * MS, "1.0", dur_ms=1 + i))
    [window] = w.close_until(T0 + 2 * SIZE)
    op = window.ops[("split", "/split/even", "1.0")]
    assert len(op.samples.values) == 8 and op.samples.seen == 50
    assert w.telemetry.events["samples_replaced"] == 42
    assert op.latency.count == 50
    assert len(op.slow.heap) == 4 and min(h[0] for h in op.slow.heap) == 47 * MS


def test_signatures_beyond_the_bound_fold_into_other() -> None:
    """With room for two signatures, a third exception type is counted under error:<label>:(other)."""
    w = ServiceStats(SIZE, GRACE, max_signatures=2)
    for exc in ("A", "B", "C", "C"):
        w.add(request(T0, "1.0", exception=exc))
    [window] = w.close_until(T0 + 2 * SIZE)
    sigs = window.ops[("split", "/split/even", "1.0")].signatures
    assert sigs == {"error:POST /split/even:A": 1, "error:POST /split/even:B": 1, "error:POST /split/even:(other)": 2}
    assert w.telemetry.dropped["max_signatures"] == 2


def test_critical_path_of_the_slowest_requests_is_kept_per_window() -> None:
    """The p95+ requests' critical paths are summed: slow requests spend most of their time in the database."""
    w = ServiceStats(SIZE, GRACE, slow_traces=8)
    for i in range(36):
        w.add(request(T0 + i * MS, "1.0", dur_ms=10, db_ms=2))
    for i in range(4):
        w.add(request(T0 + S + i * MS, "1.0", dur_ms=100, db_ms=90))
    [window] = w.close_until(T0 + 2 * SIZE)
    op = window.ops[("split", "/split/even", "1.0")]
    assert op.path_traces == 4  # p95 of 36 x 10 ms and 4 x 100 ms is 100 ms: only the slow ones
    share_db = op.path_ns["postgresql"] / sum(op.path_ns.values())
    assert 0.85 < share_db < 0.95


def test_weighted_reservoir_merge_follows_the_counts() -> None:
    """Merging a sample of 1,000 values with a sample of 10 keeps mostly the first one's values."""
    rng = random.Random(3)
    big = Reservoir(50, [1.0] * 50, 1_000)
    small = Reservoir(50, [2.0] * 10, 10)
    merged = Reservoir.merged([big, small], 50, rng)
    assert merged.seen == 1_010 and len(merged.values) == 50
    assert merged.values.count(2.0) <= 5


def test_merge_sums_windows_of_one_key() -> None:
    """Merging windows adds counts, signatures, sites and latency; an empty list merges to None."""
    w = ServiceStats(SIZE, GRACE)
    w.add(request(T0, "1.0", exception="E"))
    w.add(request(T0 + SIZE, "1.0"))
    windows = w.close_until(T0 + 3 * SIZE)
    merged = merge([x.ops[("split", "/split/even", "1.0")] for x in windows], random.Random(0), 16)
    assert merged is not None
    assert (merged.requests, merged.errors, merged.latency.count) == (2, 1, 2)
    assert merge([], random.Random(0), 16) is None


def test_stats_rows_feed_every_parameter_of_the_statement() -> None:
    """Each row has every r.<name> the STATS statement reads (but the stamp the graph sink adds to every windowed
    contribution), keyed on the graph's Operation key."""
    w = ServiceStats(SIZE, GRACE)
    w.add(request(T0, "1.0", exception="E"))
    [window] = w.close_until(T0 + 2 * SIZE)
    [row] = stats_rows(window)
    assert statement_params(schema.UPSERTS["stats"]) - {"stamp"} <= set(row)
    assert row["operation_key"] == operation_key_of("split", "/split/even") == "split:/split/even"
    assert (row["requests"], row["errors"], row["version"]) == (1, 1, "1.0")
    assert json.loads(row["signatures"]) == {"error:POST /split/even:E": 1}


def test_a_request_closed_twice_is_one_of_the_slowest_once() -> None:
    """A trace delivered again after it closed (at-least-once delivery) reassembles and counts again; its slowest
    request is kept once among the slowest (it was summed twice into the critical-path ownership, and with another
    ownership for the same span, a fragment's, the heap compared the two dicts and raised)."""
    w = ServiceStats(SIZE, GRACE, slow_traces=2)
    trace = request(T0, "1.0", dur_ms=50.0)
    w.add(trace)
    w.add(trace)
    [window] = w.close_until(T0 + SIZE + GRACE)
    [op] = window.ops.values()
    assert op.requests == 2 and op.path_traces == 1


def test_slow_traces_keep_each_request_once_and_take_back_one_they_let_go() -> None:
    slow = SlowTraces(2)
    for duration, span_id in ((5, "a"), (7, "b"), (9, "c")):  # "a" goes when "c" comes
        assert slow.wants(duration, span_id)
        slow.add(duration, span_id, {span_id: duration})
    assert not slow.wants(20, "c") and not slow.wants(6, "x")  # already kept; faster than every kept one
    slow.add(20, "c", {})  # the same request again: kept once
    assert sorted((d, s) for d, s, _ in slow.heap) == [(7, "b"), (9, "c")] and slow.ids == {"b", "c"}
    assert slow.wants(8, "a")  # let go, so wanted again
    slow.add(8, "a", {"a": 8})
    slow.add(1, "z", {})  # slower than none: not kept
    assert sorted((d, s) for d, s, _ in slow.heap) == [(8, "a"), (9, "c")] and slow.ids == {"a", "c"}
