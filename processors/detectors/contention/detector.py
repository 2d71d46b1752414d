"""The contention detector (stage ``ingest``): per operation, latency against in-flight concurrency at start.

Closed traces feed the window their root starts in (the shared tumbling windows, closed once no open trace can
reach them) with their requests (``processors.pipeline.requests``: server and root spans), at most ``max_requests`` per
operation per window (the rest counted ``max_requests``). When a window closes, each request's concurrency at start
is counted by a sweep over the window's requests of its operation (and those of the previous window still in
flight), and its (window, concurrency, latency) pair joins the operation's recent pairs (``max_pairs``, over at
most ``max_operations`` operations, the least recent dropped, counted). An operation with ``min_pairs`` from
``min_windows`` windows is tested (``fit``); significant at ``alpha`` with rho >= ``min_rho``, a Theil-Sen
interval above zero and a fitted p90/p10 latency ratio >= ``min_ratio``, it is a ``contention`` finding.
Concurrency is this instance's: with several ingest workers each sees its partitions' share of the requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

from processors.api.component import Emit, Processor, Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.detectors.contention.config import ContentionConfig
from processors.detectors.contention.finding import Operation, finding
from processors.detectors.contention.fit import fit
from processors.detectors.contention.recent import RecentPairs
from processors.model.events import Access
from processors.model.finding import FindingEvent
from processors.model.trace import ClosedTrace
from processors.model.units import s_to_ns
from processors.pipeline.requests import requests_of
from processors.state.config import WindowConfig
from processors.state.lru import CountedLRU
from processors.state.windows import TumblingWindows

COMPONENT = "contention"


@dataclass(slots=True)
class _Requests:
    version: str = ""
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # (start, end, trace id)


Parts = dict[str, dict[Operation, _Requests]]  # input partition -> operation -> its requests in the window


@dataclass(slots=True)
class _Recent:
    pairs: RecentPairs  # (window index, concurrency at start, latency ms)
    carry: list[int] = field(default_factory=list)  # ends of the last window's requests still in flight after it
    windows: int = 0


class ContentionDetector(Processor):
    """Latency against concurrency per operation; see the module docstring."""

    name = COMPONENT

    def __init__(self, config: ContentionConfig, windows: WindowConfig, *, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.config = config
        self.telemetry = (telemetry or Telemetry(COMPONENT)).declare("max_requests", "max_operations")
        self._windows: TumblingWindows[Parts] = TumblingWindows(
            COMPONENT, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s), lambda _start: {},
            max_windows=windows.max_windows, telemetry=self.telemetry, events=events,
        )  # fmt: skip
        self._recent: CountedLRU[Operation, _Recent] = CountedLRU(config.max_operations, self.telemetry,
                                                                  "max_operations")  # fmt: skip
        self._closed = 0  # windows closed so far: the pairs' window index

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        requests = requests_of(trace)
        if not requests:
            return
        parts = self._windows.at(trace.root.start_ns)
        if parts is None:
            return  # the window closed already: counted late
        ops = parts.setdefault(trace.part, {})
        max_requests = self.config.max_requests
        for req in requests:
            op = (req.service, req.operation)
            held = ops.get(op)
            if held is None:
                held = ops[op] = _Requests(req.version)
            spans = held.spans
            if len(spans) >= max_requests:
                self.telemetry.drop("max_requests")
                continue
            spans.append((req.start_ns, req.end_ns, req.trace_id))

    def on_revoke(self, part: str) -> None:
        self._windows.each(lambda parts: parts.pop(part, None))

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for window in self._windows.close_until(watermark_ns, open_since_ns):
            self._closed += 1
            try:
                out.events.extend(self._judge((window.window_id, window.start_ns, window.end_ns), window.value))
            except (ValueError, ArithmeticError) as e:  # one window's bad numbers must not stop the others
                out.quarantined.append(Quarantined(f"contention window {window.window_id}", e))
        self.telemetry.gauge("operations", len(self._recent))

    def _judge(self, window: tuple[str, int, int], parts: Parts) -> list[FindingEvent]:
        merged: dict[Operation, _Requests] = {}
        for ops in parts.values():
            for op, held in ops.items():
                m = merged.setdefault(op, _Requests(held.version))
                m.spans += held.spans
        c = self.config
        found = []
        for op, held in sorted(merged.items()):
            recent = self._recent.get(op)
            if recent is None:
                recent = _Recent(RecentPairs(c.max_pairs))
                self._recent.put(op, recent)
            recent.windows += 1
            recent.carry = _sweep(sorted(held.spans), recent.carry, window[2], self._closed, recent.pairs)
            if len(recent.pairs) < c.min_pairs or recent.windows < c.min_windows:
                continue
            rho, p, _ = recent.pairs.correlation()  # cheap; the Theil-Sen fit only when it is significant
            if p > c.alpha or rho < c.min_rho:
                continue
            pairs = list(recent.pairs)
            f = fit(pairs)
            if f.slope_low > 0 and f.ratio >= c.min_ratio:
                slow = sorted(held.spans, key=lambda s: s[0] - s[1])[:20]
                found.append(finding(op, f, pairs, window, held.version, c.alpha, [t for _, _, t in slow]))
                self.telemetry.count("findings")
        return found


def _sweep(spans: list[tuple[int, int, str]], carry: list[int], end_ns: int, index: int,
           pairs: RecentPairs) -> list[int]:  # fmt: skip
    """Add each request's (window, concurrency at start, latency) to ``pairs``, requests sorted by start;
    ``carry`` holds the ends of earlier requests that may still be in flight. Returns the ends still in flight at
    ``end_ns`` (the next window's carry)."""
    in_flight = list(carry)
    heapq.heapify(in_flight)
    found: list[tuple[int, int, float]] = []
    for start, end, _ in spans:
        while in_flight and in_flight[0] <= start:
            heapq.heappop(in_flight)
        found.append((index, len(in_flight) + 1, (end - start) / 1e6))
        heapq.heappush(in_flight, end)
    pairs.extend(index, found)
    return [e for e in in_flight if e > end_ns]
