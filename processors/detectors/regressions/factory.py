"""The regression detector as a stage-1 component: windowed service statistics in, regressions out.

Closed traces feed the per-window statistics (``stats.ServiceStats``); each closed window is written to the graph
(``STATS`` edges) and tested (``detector.RegressionDetector``); every regression is published as a
``RegressionEvent`` on the incidents topic.
"""

from __future__ import annotations

from collections.abc import Sequence

from processors.component import Context, Emit, Factory, Processor
from processors.detectors.regressions.config import RegressionConfig
from processors.detectors.regressions.detector import DetectorSettings, RegressionDetector
from processors.detectors.regressions.stats import ServiceStats, stats_rows
from processors.model.events import Access
from processors.model.regression import RegressionEvent
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig
from processors.state.provenance import NO_EVENTS, StateEvents
from processors.telemetry import Telemetry
from processors.traces import ClosedTrace


class Regressions(Processor):
    """Statistics windows and the regression tests on each; see the module docstring."""

    name = "regressions"

    def __init__(self, config: RegressionConfig, windows: WindowConfig, *, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.telemetry = telemetry or Telemetry("regressions")
        r = config
        self.stats = ServiceStats(s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                                  reservoir_size=r.reservoir_size, slow_traces=r.slow_traces,
                                  max_signatures=r.max_signatures, max_sites=r.max_sites, seed=r.seed,
                                  max_windows=windows.max_windows, telemetry=self.telemetry,
                                  events=events)  # fmt: skip
        settings = DetectorSettings(baseline_windows=r.baseline_windows, fdr=r.fdr, min_requests=r.min_requests,
                                    min_samples=r.min_samples, min_latency_ratio=r.min_latency_ratio,
                                    reservoir_size=r.reservoir_size, seed=r.seed)  # fmt: skip
        self.detector = RegressionDetector(settings, telemetry=self.telemetry)

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        self.stats.add(trace)

    def on_revoke(self, part: str) -> None:
        self.stats.forget_part(part)

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for window in self.stats.close_until(watermark_ns, open_since_ns):
            out.graph.stats.extend(stats_rows(window))
            findings = self.detector.on_window(window)
            out.events.extend(findings.regressions)
        self.telemetry.gauge("open_windows", len(self.stats))


def create(config: RegressionConfig, ctx: Context) -> Regressions:
    return Regressions(config, ctx.section("windows", WindowConfig), telemetry=ctx.telemetry("regressions"),
                       events=ctx.state_events)  # fmt: skip


FACTORY: Factory[RegressionConfig, Regressions] = Factory(
    kind="detector", name="regressions", config=RegressionConfig, create=create, stage="ingest",
    events=(RegressionEvent,),
)  # fmt: skip
