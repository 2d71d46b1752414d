"""A 30 s hang on 20 of 320 requests of a route, through trace assembly, statistics and the regression detector."""

from __future__ import annotations

from collections.abc import Sequence

from processors.detectors.regressions.detector import RegressionDetector
from processors.detectors.regressions.stats import ServiceStats, StatsWindow
from processors.model.span import Span
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig
from tests.detectors.traffic import Hop, assemble, route_traffic

PER_WINDOW = 320


def closed_windows(spans: Sequence[Span], w: WindowConfig) -> list[StatsWindow]:
    """The statistics windows the assembled traffic closes, in order."""
    stats = ServiceStats(s_to_ns(w.window_s), s_to_ns(w.trace_gap_s))
    out: list[StatsWindow] = []
    for watermark, traces, open_since in assemble(spans, w):
        for trace in traces:
            stats.add(trace)
        out += stats.close_until(watermark, open_since)
    return out


def test_a_30s_hang_on_20_of_320_requests_is_a_latency_regression() -> None:
    """Five windows of 320 requests; the fourth's last 20 calls to inventory hang 30 s (no error): GET /checkout's
    latency regresses against its baseline. Every hung request is counted, in one trace with its root: the
    fifth window's traffic moves event time past the fourth's end (plus the gap) before the hung roots end."""
    w = WindowConfig()
    hung = [(4 * PER_WINDOW - 20 + i, Hop(30_000.0)) for i in range(20)]
    windows = closed_windows(route_traffic(5, PER_WINDOW, odd=hung, seed=3), w)
    assert len(windows) == 5
    last = windows[3]
    [checkout] = [op for (svc, op_name, _), op in last.ops.items() if (svc, op_name) == ("shop", "/checkout")]
    assert checkout.requests == PER_WINDOW  # no hung request split into a rootless part and a late root
    assert checkout.latency.quantile(0.99) > 29_000
    detector = RegressionDetector()
    found = [r for win in windows for r in detector.on_window(win).regressions]
    assert {(r.service, r.operation, r.metric) for r in found} >= {("shop", "/checkout", "latency")}
    [checkout_event] = [r for r in found if (r.service, r.operation) == ("shop", "/checkout")]
    assert checkout_event.window == last.window_id


def test_the_same_traffic_without_the_hang_is_no_regression() -> None:
    """The control: five windows of the same traffic, no hang: no regression of any kind."""
    windows = closed_windows(route_traffic(5, PER_WINDOW, seed=3), WindowConfig())
    detector = RegressionDetector()
    assert [r for win in windows for r in detector.on_window(win).regressions] == []
