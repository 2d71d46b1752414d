"""The regression tests in stage 2, on the shares of every stage-1 instance (``shares``).

Stage 1 keeps the windowed statistics of the spans partitions it owns; with several instances (``--workers``) no
one of them sees a window's whole traffic. The judge collects each window's shares from the internal topic (keyed
state that holds their records until the window is tested, so a crash replays them) and tests the merged window
once stage 2's event time, the minimum over every instance's promise, has passed its end plus the trace gap: by
then every instance has closed the window and relayed its shares ahead of that promise. One judge tests every
window: the shares travel under one key.

A share relayed twice (a stage-1 instance replaying input it had not committed, after a crash or a rebalance) is
kept once: of two shares of one (window, input partition, operation, version), the one that counted more requests
stays (a replay of the same input counts the same or, replayed from the middle of a window, fewer). A share for a
window already tested is late: counted (``judge_late``), left out. A share must describe one window of the
configured size ending at its relay's event time, which stage 2 refuses beyond the wall clock: a corrupt or foreign
one is dead-lettered instead of opening a window that never closes (and never lets its input be committed).
"""

from __future__ import annotations

import random

from processors.api.component import Emit, Processor
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.detectors.regressions.config import RegressionConfig
from processors.detectors.regressions.detector import DetectorSettings, RegressionDetector
from processors.detectors.regressions.shares import COMPONENT, Share
from processors.detectors.regressions.stats import Parts, StatsWindow, merge_parts
from processors.model.events import Relay
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig
from processors.state.windows import TumblingWindows


class RegressionJudge(Processor):
    """Windows of shares in, regressions out; see the module docstring."""

    name = COMPONENT

    def __init__(self, config: RegressionConfig, windows: WindowConfig, *, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.telemetry = (telemetry or Telemetry(COMPONENT)).declare("shares_replayed")
        self.reservoir_size = config.reservoir_size
        self._rng = random.Random(config.seed)
        self._windows: TumblingWindows[Parts] = TumblingWindows(
            "judge", s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s), lambda _start: {},
            max_windows=windows.max_windows, telemetry=self.telemetry, events=events,
        )  # fmt: skip
        self._sources: set[str] = set()  # the internal partitions shares came from
        r = config
        settings = DetectorSettings(baseline_windows=r.baseline_windows, fdr=r.fdr, min_requests=r.min_requests,
                                    min_samples=r.min_samples, min_latency_ratio=r.min_latency_ratio,
                                    reservoir_size=r.reservoir_size, seed=r.seed)  # fmt: skip
        self.detector = RegressionDetector(settings, telemetry=self.telemetry)

    def on_relay(self, relay: Relay, part: str) -> None:
        share = Share.model_validate(relay.body)  # pydantic's ValidationError is a ValueError: dead-lettered
        size = self._windows.size_ns
        if share.end_ns != relay.at_ns or share.end_ns - share.start_ns != size or share.start_ns % size:
            raise ValueError(f"share: window {share.start_ns}-{share.end_ns} is not a {size} ns window ending at "
                             f"{relay.at_ns}")  # fmt: skip
        op = share.op(self.reservoir_size)
        parts = self._windows.at(share.start_ns)
        if parts is None:
            return  # the window was tested already: counted late
        self._sources.add(part)
        ops = parts.setdefault(share.part, {})
        held = ops.get(op.key)
        if held is not None:
            self.telemetry.drop("shares_replayed")
            if held.requests >= op.requests:
                return
        ops[op.key] = op

    def on_revoke(self, part: str) -> None:
        """The internal partition the shares came in went to another instance: it replays them, and tests."""
        if part in self._sources:
            self._sources.discard(part)
            self._windows.each(lambda parts: parts.clear())

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for window in self._windows.close_until(watermark_ns):
            if not window.value:
                continue
            ops = merge_parts(window.value, self._rng, self.reservoir_size)
            merged = StatsWindow(window.window_id, window.start_ns, window.end_ns, ops)  # the history keeps no parts
            out.events.extend(self.detector.on_window(merged).regressions)
        self.telemetry.gauge("judge_windows", len(self._windows))
