"""The serialized fan-out detector on planted fan-outs and on controls that must stay silent."""

from __future__ import annotations

from processors.api.telemetry import Telemetry
from processors.detectors.fanout import FanoutConfig, FanoutData, FanoutDetector
from processors.model.finding import data_of
from tests.detectors.trace_kit import GAP_NS, MS, T0, WINDOW_NS, Request, close_all


def detector(**config: object) -> FanoutDetector:
    return FanoutDetector(FanoutConfig(**config), WINDOW_NS, GAP_NS, telemetry=Telemetry("fanout_test"))  # type: ignore[arg-type]


def fanout(i: int, n: int = 10, k: int = 2, dur_ms: float = 40) -> Request:
    """GET /dashboard: ``n`` calls to pricing's /price/{sku}, ``k`` at a time (the planted serialized fan-out)."""
    r = Request("/dashboard", T0 + i * 100 * MS, service="frontend")
    for c in range(n):
        r.call("pricing", "/price/{sku}", 1 + (c // k) * (dur_ms + 1), dur_ms)
    return r


def test_planted_fanout_two_at_a_time() -> None:
    """Twenty requests making ten pricing calls two at a time: one finding with N, k, the saving and the charts."""
    d = detector()
    for i in range(20):
        d.on_trace(fanout(i).trace(), ())
    [finding] = close_all(d)
    data = data_of(finding, FanoutData)
    assert finding.type == "serialized_fanout" and finding.remedy == "parallelize_calls"
    assert (data.dependency, data.operation, data.max_calls, data.max_concurrency) == ("pricing", "/price/{sku}", 10, 2)
    assert (data.requests, data.requests_seen) == (20, 20)
    # five rounds of 40 ms (1 ms apart) are busy 200 ms; all at once: 40 ms; saved: 160 ms of the critical path
    assert (data.serial_ms_mean, data.ideal_ms_mean, data.saving_ms_mean) == (200, 40, 160)
    assert (
        finding.contract is not None
        and finding.contract.signature == f"finding:serialized_fanout:{finding.fingerprint}"
    )
    assert finding.contract.routes == ["/dashboard"] and finding.contract.baseline_rate == 1.0
    calls, inflight = finding.series
    assert {p.y for p in calls.points} == {10} and max(p.y for p in inflight.points) == 2


def test_sequential_http_calls_are_a_fanout_of_one() -> None:
    """k = 1 over HTTP (a loop of remote calls) is serialized fan-out too."""
    d = detector()
    d.on_trace(fanout(0, n=6, k=1, dur_ms=20).trace(), ())
    [finding] = close_all(d)
    assert data_of(finding, FanoutData).max_concurrency == 1


def test_controls_stay_silent() -> None:
    """Calls already concurrent, too few calls, calls to different dependencies, a saving too small to matter, and
    sequential DB statements (the N+1 detector's): no finding."""
    d = detector()
    d.on_trace(fanout(0, n=10, k=10).trace(), ())  # all at once
    d.on_trace(fanout(1, n=10, k=6).trace(), ())  # 6 of 10 at a time: not k << N
    d.on_trace(fanout(2, n=4, k=1).trace(), ())  # too few calls
    d.on_trace(fanout(3, n=10, k=1, dur_ms=2).trace(), ())  # saves 18 ms: below min_saving_ms
    mixed = Request("/home", T0 + 5 * MS)
    for c, callee in enumerate(("cart", "pricing", "users", "ads", "search", "reviews")):
        mixed.call(callee, "/api", 1 + 30 * c, 29)
    d.on_trace(mixed.trace(), ())
    db = Request("/orders", T0 + 6 * MS)
    for c in range(10):
        db.db("SELECT * FROM items WHERE id = %s", 1 + 21 * c, 20, (c,))
    d.on_trace(db.trace(), ())
    background = fanout(7, n=10, k=1, dur_ms=20)  # the calls are off the critical path: a longer call covers them
    background.call("search", "/query", 0.5, 400)
    d.on_trace(background.trace(), ())
    assert close_all(d) == []


def test_db_pool_running_k_at_a_time_is_a_fanout() -> None:
    """Statements over a pool of 2 connections (k = 2 > 1) are this detector's, not N+1's."""
    d = detector()
    r = Request("/report", T0)
    for c in range(10):
        r.db("SELECT sum(x) FROM part WHERE shard = %s", 1 + (c // 2) * 31, 30, (c,))
    d.on_trace(r.trace(), ())
    [finding] = close_all(d)
    assert data_of(finding, FanoutData).dependency == "postgresql"
