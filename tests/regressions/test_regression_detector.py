"""The regression detector: version and baseline comparisons, exact tests, rank test, FDR, insufficient data."""

from __future__ import annotations

import json
import random

import pytest

from processors.detectors.regressions.detector import DetectorSettings, RegressionDetector, regression_fingerprint
from processors.detectors.regressions.stats import ServiceStats, StatsWindow
from processors.model.regression import RegressionEvent
from processors.model.trace import ClosedTrace
from sinks.graph import schema
from sinks.graph.records import regression_row
from tests.regressions.builders import T0, S, request, statement_params

SIZE = 10 * S
SIG = "error:POST /split/even:RoundingError"


def windows(*batches: list[ClosedTrace]) -> list[StatsWindow]:
    """One closed statistics window per batch of traces, batch i in window i."""
    stats = ServiceStats(SIZE, S)
    out: list[StatsWindow] = []
    for i, batch in enumerate(batches):
        for trace in batch:
            stats.add(trace)
        out += stats.close_until(T0 + (i + 2) * SIZE)
    return out


def traffic(window: int, version: str, n: int, *, errors: int = 0, route: str = "/split/even", exception: str = "",
            dur_ms: float = 10.0, db_ms: float = 0.0, seed: int = 0) -> list[ClosedTrace]:  # fmt: skip
    """``n`` requests spread over window ``window``, the first ``errors`` of them failing with ``exception``."""
    rng = random.Random(seed)
    base = T0 + window * SIZE
    return [request(base + i * (SIZE // (n + 1)), version, route=route, dur_ms=dur_ms * rng.uniform(0.8, 1.2),
                    db_ms=db_ms, exception=exception if i < errors else "") for i in range(n)]  # fmt: skip


def test_a_new_error_signature_in_a_new_version_is_a_regression_with_exact_evidence() -> None:
    """0.9 serves 400 clean requests, 1.0 fails 12 of 400: conditional binomial p = 0.5**12, flagged."""
    w0, w1 = windows(traffic(0, "0.9", 400), traffic(1, "1.0", 400, errors=12, exception="RoundingError", seed=1))
    detector = RegressionDetector()
    assert detector.on_window(w0).regressions == []
    found = detector.on_window(w1)
    [event] = found.regressions
    assert (event.service, event.operation, event.signature, event.metric) == ("split", "/split/even", SIG, "errors")
    assert (event.version, event.previous_version, event.commit) == ("1.0", "0.9", "rev-1.0")
    [ev] = [e for e in event.evidence if e.comparison == "version"]
    assert (ev.before_errors, ev.before_requests, ev.after_errors, ev.after_requests) == (0, 400, 12, 400)
    assert ev.p_value == pytest.approx(0.5**12)
    assert ev.p_adjusted == pytest.approx(0.5**12 * found.tests)  # the smallest of the family
    assert ev.before_version == "0.9" and ev.after_version == "1.0" and ev.after_window == w1.window_id
    assert ev.effect is None and ev.ratio_high is None  # infinite: the rate before was 0
    assert event.fingerprint == regression_fingerprint("split", "/split/even", SIG)
    assert "12/400 now vs 0/400 in 0.9 (previous version)" in event.summary


def test_the_fingerprint_is_stable_across_windows_and_the_occurrence_is_not() -> None:
    """The same regression in two windows: one fingerprint, two occurrences (one Incident, two Occurrences)."""
    w = windows(traffic(0, "0.9", 400), traffic(1, "1.0", 400, errors=12, exception="RoundingError"),
                traffic(2, "1.0", 400, errors=40, exception="RoundingError"))  # fmt: skip
    detector = RegressionDetector()
    events = [e for win in w for e in detector.on_window(win).regressions]
    assert len(events) == 2
    assert events[0].fingerprint == events[1].fingerprint
    assert events[0].occurrence != events[1].occurrence
    assert {e.comparison for e in events[1].evidence} == {"baseline", "version"}


def test_latency_regression_against_the_rolling_baseline_shows_the_critical_path_shift() -> None:
    """Three 10 ms windows, then 30 ms with 22 ms in the database: Mann-Whitney flags it; postgresql's share grows."""
    batches = [traffic(i, "1.0", 100, dur_ms=10, db_ms=2, seed=i) for i in range(3)]
    batches.append(traffic(3, "1.0", 100, dur_ms=30, db_ms=22, seed=9))
    detector = RegressionDetector(DetectorSettings(baseline_windows=3))
    results = [detector.on_window(w) for w in windows(*batches)]
    assert [len(r.regressions) for r in results] == [0, 0, 0, 1]
    [event] = results[3].regressions
    assert (event.metric, event.signature, event.previous_version) == ("latency", "latency:POST /split/even", "")
    [ev] = event.evidence
    assert ev.comparison == "baseline" and len(ev.before_windows) == 3 and ev.test == "Mann-Whitney U"
    assert ev.p_value < 1e-10 and ev.after_p50_ms > 2 * ev.before_p50_ms
    top = event.critical_path[0]
    assert top.owner in {"postgresql", "split"} and abs(top.delta) > 0.3
    assert {p.owner: p.delta for p in event.critical_path}["postgresql"] > 0.3


def test_a_significant_but_small_latency_shift_is_not_a_regression() -> None:
    """A 5% slowdown on many samples is significant for Mann-Whitney but below the 1.2x practical threshold."""
    w = windows(traffic(0, "1.0", 400, dur_ms=10, seed=1), traffic(1, "1.0", 400, dur_ms=10.5, seed=2))
    detector = RegressionDetector(DetectorSettings(reservoir_size=1024))
    detector.on_window(w[0])
    found = detector.on_window(w[1])
    assert found.tests == 1 and found.regressions == []


def test_too_little_traffic_is_insufficient_data_with_what_is_missing() -> None:
    """10 baseline and 5 new requests (2 failing) are no verdict: 25 more now and 20 more in the baseline."""
    w = windows(traffic(0, "0.9", 10), traffic(1, "1.0", 5, errors=2, exception="RoundingError"))
    detector = RegressionDetector()
    detector.on_window(w[0])
    found = detector.on_window(w[1])
    assert found.regressions == [] and found.tests == 0
    [gap] = [g for g in found.insufficient if g.metric == "errors"]
    assert (gap.comparison, gap.signature, gap.version) == ("version", SIG, "1.0")
    assert (gap.requests, gap.requests_needed, gap.baseline_requests, gap.baseline_needed) == (5, 25, 10, 20)


def test_too_few_errors_to_ever_be_significant_is_insufficient_with_errors_needed() -> None:
    """One error against a clean build of equal traffic could never reach 5%: 4 more errors are needed."""
    w = windows(traffic(0, "0.9", 100), traffic(1, "1.0", 100, errors=1, exception="RoundingError"))
    detector = RegressionDetector()
    detector.on_window(w[0])
    found = detector.on_window(w[1])
    [gap] = [g for g in found.insufficient if g.metric == "errors"]
    assert gap.errors_needed == 4 and gap.requests_needed == 0 and "5 needed" in gap.reason


def _family(ops: int) -> list[StatsWindow]:
    """Operation 0 goes from 0/300 to 3/100 errors (p = 0.25**3); the others stay at 3% (no change)."""
    before, after = [], []
    for k in range(ops):
        route = f"/op{k}"
        before += traffic(0, "1.0", 300, errors=0 if k == 0 else 9, route=route, exception="E", seed=k)
        after += traffic(1, "1.0", 100, errors=3, route=route, exception="E", seed=100 + k)
    return windows(before, after)


def test_benjamini_hochberg_controls_false_discoveries_across_operations() -> None:
    """p = 0.0156 flags one operation alone, but not among ten operations' twenty tests."""
    alone = RegressionDetector()
    for w in _family(1):
        found = alone.on_window(w)
    assert [e.operation for e in found.regressions] == ["/op0"]
    assert found.regressions[0].evidence[0].p_value == pytest.approx(0.25**3)

    many = RegressionDetector()
    for w in _family(10):
        found = many.on_window(w)
    assert found.tests == 20  # one count test and one rank test per operation
    assert found.regressions == []


def test_regression_event_round_trips_and_feeds_its_graph_statement() -> None:
    """The event is versioned JSON (kind 'regression'); its row has every parameter of schema.RECORDS["regression"]."""
    w0, w1 = windows(traffic(0, "0.9", 400), traffic(1, "1.0", 400, errors=12, exception="RoundingError"))
    detector = RegressionDetector()
    detector.on_window(w0)
    [event] = detector.on_window(w1).regressions
    data = json.loads(event.model_dump_json())
    assert (data["schema_version"], data["kind"]) == (1, "regression")
    assert RegressionEvent.model_validate_json(event.model_dump_json()) == event
    row = regression_row(event)
    assert statement_params(schema.RECORDS["regression"]) <= set(row)
    assert row["operation_key"] == "split:/split/even"


def test_the_previous_version_is_the_one_first_seen_just_before() -> None:
    """Versions are ordered by first-seen event time, not by their names."""
    detector = RegressionDetector()
    for w in windows(traffic(0, "2.0", 5), traffic(1, "10.0", 5), traffic(2, "3.0", 5)):
        detector.on_window(w)
    assert detector.previous_version("split", "3.0") == "10.0"
    assert detector.previous_version("split", "10.0") == "2.0"
    assert detector.previous_version("split", "2.0") == ""
    assert detector.previous_version("other", "1") == ""
