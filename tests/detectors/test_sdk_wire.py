"""The three detectors behind the real decoder and ingest stage, on spans the OpenTelemetry SDK made and encoded.

Stock instrumentation's shape: DB client spans with ``db.system.name`` and ``db.query.text`` and no parameters,
HTTP client spans named by their method with ``http.response.status_code``. One request of each planted defect and
one healthy request (the control) go through the shipped settings: one finding of each type, about its request."""

from __future__ import annotations

import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from bench.otlp_gen import Generated
from bench.pertrace_benign import run
from tests.otlp_factory import ShopTelemetry, to_proto

MS = 1_000_000


def _request(shop: ShopTelemetry, route: str, t0: int, calls: list[tuple[str, int, int, int]]) -> None:
    """A SERVER span for ``route`` and under it (sql-or-method, start ms, duration ms, HTTP status) client spans."""
    tracer = shop.tracer
    end = t0 + (max(at + dur for _, at, dur, _ in calls) + 2) * MS
    server = tracer.start_span(f"GET {route}", kind=SpanKind.SERVER, start_time=t0)
    server.set_attribute("http.route", route)
    server.set_attribute("http.response.status_code", 200)
    ctx = trace.set_span_in_context(server)
    for what, at, dur, status in calls:
        if what.startswith("SELECT"):
            span = tracer.start_span(what.split(" WHERE")[0], ctx, kind=SpanKind.CLIENT, start_time=t0 + at * MS)
            span.set_attribute("db.system.name", "postgresql")
            span.set_attribute("db.query.text", what)
        else:
            span = tracer.start_span(what, ctx, kind=SpanKind.CLIENT, start_time=t0 + at * MS)
            span.set_attribute("http.request.method", what)
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=t0 + (at + dur) * MS)
    server.end(end_time=end)


def test_each_planted_defect_is_found_once_and_the_control_is_not() -> None:
    """An item loop, eight calls two at a time, four attempts after 503s, and a healthy request."""
    shop = ShopTelemetry(service="storefront")
    t0 = time.time_ns() - 5_000 * MS
    item = "SELECT id, name FROM items WHERE id = $1"
    _request(shop, "/orders/{id}", t0, [(item, 1 + 4 * k, 3, 0) for k in range(12)])
    _request(shop, "/dashboard", t0 + 300 * MS, [("GET", 1 + (k // 2) * 41, 40, 200) for k in range(8)])
    _request(shop, "/checkout", t0 + 700 * MS, [("POST", 1 + 6 * k, 5, 503) for k in range(4)])
    _request(shop, "/health", t0 + 900 * MS, [(item, 1, 3, 0), ("GET", 5, 10, 200)])
    spans = shop.take()
    gen = Generated(messages=[to_proto(spans)], spans=len(spans), start_ns=t0)
    report = run(gen)
    assert report["findings"] == {"n_plus_one": 1, "serialized_fanout": 1, "retry_storm": 1}
    routes = {e.type: e.subject.operation for e in report["events"]}
    assert routes == {"n_plus_one": "/orders/{id}", "serialized_fanout": "/dashboard", "retry_storm": "/checkout"}
    by_type = {e.type: e for e in report["events"]}
    assert by_type["n_plus_one"].data["with_parameters"] is False
    assert by_type["n_plus_one"].data["max_per_request"] == 12
    assert by_type["retry_storm"].data["max_attempts"] == 4
    assert by_type["serialized_fanout"].data["max_concurrency"] == 2
