"""The retry storm detector on planted storms (within a trace, across a burst) and on controls that stay silent."""

from __future__ import annotations

from processors.api.telemetry import Telemetry
from processors.detectors.retry_storm import RetryStormConfig, RetryStormData, RetryStormDetector
from processors.model.finding import data_of
from tests.detectors.trace_kit import GAP_NS, MS, T0, WINDOW_NS, Request, close_all


def detector(**config: object) -> RetryStormDetector:
    return RetryStormDetector(RetryStormConfig(**config), WINDOW_NS, GAP_NS, telemetry=Telemetry("retry_test"))  # type: ignore[arg-type]


def retrying(i: int, attempts: int, *, gap_ms: float = 0.2, succeed: bool = False) -> Request:
    """POST /checkout calling payments' /charges ``attempts`` times, each after a 503 (the last one may succeed)."""
    r = Request("/checkout", T0 + i * 100 * MS, method="POST")
    at = 1.0
    for a in range(attempts):
        ok = succeed and a == attempts - 1
        r.call("payments", "/charges", at, 5, status=200 if ok else 503, name="POST")
        at += 5 + gap_ms
    return r


def test_storm_within_a_trace() -> None:
    """One request trying a failing call five times without waiting: a storm within the trace, remedy backoff."""
    d = detector()
    d.on_trace(retrying(0, 5).trace(), ())
    [finding] = close_all(d)
    data = data_of(finding, RetryStormData)
    assert finding.type == "retry_storm" and finding.remedy == "backoff_with_jitter"
    assert (data.dependency, data.operation, data.max_attempts) == ("payments", "/charges", 5)
    assert data.within_trace and not data.burst
    assert (data.attempts, data.logical_calls, data.amplification, data.exhausted) == (5, 1, 5.0, 1)
    assert finding.contract is not None and finding.contract.signature == f"finding:retry_storm:{finding.fingerprint}"
    assert finding.contract.routes == ["/checkout"]


def test_burst_across_traces_with_amplification() -> None:
    """Twelve requests retrying a failing call once (after backing off 200 ms) and eight that gave up at once: no
    request reached min_attempts, but the burst made payments see 32 failed attempts for 20 calls (x1.6); remedy: a
    retry budget."""
    d = detector()
    for i in range(12):
        d.on_trace(retrying(i, 2, gap_ms=200).trace(), ())
    for i in range(12, 20):
        d.on_trace(retrying(i, 1).trace(), ())
    [finding] = close_all(d)
    data = data_of(finding, RetryStormData)
    assert data.burst and not data.within_trace and finding.remedy == "retry_budget"
    assert (data.requests, data.requests_seen, data.attempts, data.logical_calls) == (12, 20, 32, 20)
    assert data.amplification == 1.6 and data.failed_share == 1.0 and data.exhausted == 12
    assert finding.contract is not None and finding.contract.baseline_rate == 0.6


def test_retries_that_win_after_one_conflict_are_no_burst() -> None:
    """Twelve requests whose call failed once and won on its retry (serialization retries under contention): the
    same amplification, but 12 of 32 attempts failed: the dependency is not failing, no finding."""
    d = detector()
    for i in range(12):
        d.on_trace(retrying(i, 2, gap_ms=200, succeed=True).trace(), ())
    for i in range(12, 20):
        d.on_trace(retrying(i, 1, succeed=True).trace(), ())
    assert close_all(d) == []


def test_controls_stay_silent() -> None:
    """One retry in a few requests, repeated calls that all succeeded (not retries), failures never retried, and
    an attempt made while the failing one was still running (not after it): no finding."""
    d = detector()
    for i in range(3):
        d.on_trace(retrying(i, 2, succeed=True).trace(), ())
    ok = Request("/checkout", T0 + 5 * MS)
    for a in range(6):
        ok.call("payments", "/charges", 1 + 6 * a, 5)
    d.on_trace(ok.trace(), ())
    for i in range(30):  # a failing dependency, no retries: errors, not a storm
        d.on_trace(retrying(10 + i, 1).trace(), ())
    hedged = Request("/checkout", T0 + 50 * MS)
    hedged.call("payments", "/charges", 1, 10, status=503)
    hedged.call("payments", "/charges", 5, 10, status=503)
    hedged.call("payments", "/charges", 9, 10, status=503)
    d.on_trace(hedged.trace(), ())
    assert close_all(d) == []


def test_database_statement_retried_after_serialization_failures() -> None:
    """A statement retried after errors (serialization failures) is a storm on the database."""
    d = detector()
    r = Request("/reserve", T0, method="POST")
    for a in range(4):
        r.db("UPDATE stock SET n = n - 1 WHERE sku = %s", 1 + 3 * a, 2, ("s1",), error=a < 3)
    d.on_trace(r.trace(), ())
    [finding] = close_all(d)
    data = data_of(finding, RetryStormData)
    assert data.dependency == "postgresql" and data.operation == "update stock set n = n - ? where sku = ?"
    assert data.exhausted == 0 and data.max_attempts == 4


def test_healthy_calls_never_crowd_a_storm_out_of_the_bound() -> None:
    """Calls without retries are counted apart from the tallies: with room for one tally per window, fifty healthy
    routes seen first leave it to the storm that comes after them."""
    d = detector(max_fingerprints=1)
    for i in range(50):
        ok = Request(f"/page/{i}", T0 + i * MS)
        ok.call("catalog", "/items", 1, 5)
        d.on_trace(ok.trace(), ())
    d.on_trace(retrying(60, 5).trace(), ())
    [finding] = close_all(d)
    assert finding.subject.operation == "/checkout"
    assert d.telemetry.dropped.get("max_fingerprints", 0) == 0
