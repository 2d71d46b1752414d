"""The regression detector as two halves of one component, both configured by ``[regressions]``.

* Stage 1 (``Regressions``): closed traces feed the per-window statistics of the spans partitions this instance
  owns (``stats.ServiceStats``); each closed window is written to the graph (``STATS`` edges, summed over input
  partitions there) and relayed to stage 2 as shares (``shares``).
* Stage 2 (``judge.RegressionJudge``): the shares of every stage-1 instance are merged per window and tested
  (``detector.RegressionDetector``); every regression is published as a ``RegressionEvent`` on the incidents topic.
  So N stage-1 instances (``--workers N``) test what one would: each window's whole traffic, once.
"""

from __future__ import annotations

from collections.abc import Sequence

from processors.api.component import Context, Emit, Factory, Processor
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.detectors.regressions.config import RegressionConfig
from processors.detectors.regressions.judge import RegressionJudge
from processors.detectors.regressions.shares import COMPONENT, shares
from processors.detectors.regressions.stats import ServiceStats, stats_rows
from processors.model.events import Access
from processors.model.regression import RegressionEvent
from processors.model.trace import ClosedTrace
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig


class Regressions(Processor):
    """Statistics windows of this instance's traffic, written and relayed; see the module docstring."""

    name = COMPONENT

    def __init__(self, config: RegressionConfig, windows: WindowConfig, *, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.telemetry = telemetry or Telemetry(COMPONENT)
        r = config
        self.stats = ServiceStats(s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                                  reservoir_size=r.reservoir_size, slow_traces=r.slow_traces,
                                  max_signatures=r.max_signatures, max_sites=r.max_sites, seed=r.seed,
                                  max_windows=windows.max_windows, telemetry=self.telemetry,
                                  events=events)  # fmt: skip

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        self.stats.add(trace)

    def on_revoke(self, part: str) -> None:
        self.stats.forget_part(part)

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for window in self.stats.close_until(watermark_ns, open_since_ns):
            out.graph.stats.extend(stats_rows(window))
            out.relays.extend(shares(window))
        self.telemetry.gauge("open_windows", len(self.stats))


def create(config: RegressionConfig, ctx: Context) -> Regressions:
    return Regressions(config, ctx.section("windows", WindowConfig), telemetry=ctx.telemetry(COMPONENT),
                       events=ctx.state_events)  # fmt: skip


def create_judge(config: RegressionConfig, ctx: Context) -> RegressionJudge:
    return RegressionJudge(config, ctx.section("windows", WindowConfig), telemetry=ctx.telemetry(COMPONENT),
                           events=ctx.state_events)  # fmt: skip


FACTORY: Factory[RegressionConfig, Regressions] = Factory(
    kind="detector", name="regressions", config=RegressionConfig, create=create, stage="ingest",
)  # fmt: skip
JUDGE: Factory[RegressionConfig, RegressionJudge] = Factory(
    kind="detector", name="regression_judge", config=RegressionConfig, create=create_judge, stage="entities",
    events=(RegressionEvent,), section="regressions",
)  # fmt: skip
