"""The hang detector (stage ``ingest``): per window, each hop's calls judged against the hop's recent durations.

Closed traces feed the window their root starts in (the shared tumbling windows: a window closes once no open
trace can reach it, so a request longer than the trace gap is judged whole). A call is *hung* when it ended
without an error after more than ``max(factor x p99, min_hang_s)`` of its hop's recent durations (judged when the
hop has ``min_baseline`` of them), and *unanswered* when it failed with a client timeout and no server span of the
callee answered it. A hop with ``min_calls`` of either in a window is a ``hang`` finding (``finding``). Each
closed window adds a sample of its hop's other durations to the hop's recent distribution (hung calls stay out of
it, so a hang that persists does not become the norm).

A call past ``min_hang_s`` whose trace closes before its hop has a distribution (a backlog read in large batches
closes every trace before any window: the hop's first windows are still open) waits in its window, at most
``per_window`` per hop (past that it joins the durations unjudged, counted ``unjudged``), and is judged when its
window closes, against the windows before it: the batches the input comes in do not change the findings.

State is bounded: windows by ``[windows] max_windows``, examples per hop and window by ``finding.MAX_EXAMPLES``,
hops by ``max_hops`` (the least recently seen hop's distribution is dropped, counted ``max_hops``). The
distributions are this instance's: with several ingest workers each judges the traffic of the partitions it owns.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from processors.api.component import Emit, Processor, Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.detectors.hangs.config import HangConfig
from processors.detectors.hangs.finding import MAX_EXAMPLES, Baseline, HopWindow, finding
from processors.detectors.hangs.hops import Hop, answering, operation_above, timed_out
from processors.model.events import Access, StatusCode
from processors.model.finding import FindingEvent
from processors.model.trace import ClosedTrace
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig
from processors.state.lru import CountedLRU
from processors.state.windows import TumblingWindows

COMPONENT = "hangs"
_ERROR = StatusCode.ERROR
Parts = dict[str, dict[Hop, HopWindow]]  # input partition -> hop -> its calls in the window


class HangDetector(Processor):
    """Hung calls per hop and window; see the module docstring."""

    name = COMPONENT

    def __init__(self, config: HangConfig, windows: WindowConfig, *, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.config = config
        self.telemetry = (telemetry or Telemetry(COMPONENT)).declare("max_hops", "learned_callees", "unjudged")
        self._windows: TumblingWindows[Parts] = TumblingWindows(
            COMPONENT, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s), lambda _start: {},
            max_windows=windows.max_windows, telemetry=self.telemetry, events=events,
        )  # fmt: skip
        self._recent: CountedLRU[Hop, deque[float]] = CountedLRU(config.max_hops, self.telemetry, "max_hops")
        self._thresholds: dict[Hop, tuple[float, Baseline]] = {}  # recomputed when a window closes
        self._learned: CountedLRU[tuple[str, str], str] = CountedLRU(config.max_hops, self.telemetry, "learned_callees")
        self._rng = random.Random(0)

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        facts = trace.facts
        clients = facts.clients
        if not clients:
            return
        parts = self._windows.at(trace.root.start_ns)
        # None: the window closed already (counted late); the calls still teach ``_learned`` their callees
        hops = parts.setdefault(trace.part, {}) if parts is not None else None
        by_id = facts.by_id
        servers = answering(trace)
        learned = self._learned
        above: dict[str, str] = {}  # parent span id -> operation (hops.operation_above: a parent in the call's service)
        per_window = self.config.per_window
        floor_ms = self.config.min_hang_s * 1e3
        thresholds = self._thresholds
        trace_id = trace.trace_id
        randrange = self._rng.randrange
        for span in clients:  # each call's hop (hops module docstring), then its window
            resource = span.resource
            service = resource.service
            name = span.name
            server = servers.get(span.span_id)
            callee = server.resource.service if server is not None else None  # "": one without a service answered
            detail = span.detail
            db = detail.db
            answer = server is not None or db is not None
            if callee:
                learned.put((service, name), callee)
            else:
                callee = db.system if db is not None else learned.get((service, name)) or name
            parent = by_id.get(span.parent_id)
            if parent is None or parent.resource.service != service:
                operation = detail.route or name
            else:
                found = above.get(span.parent_id)
                if found is None:
                    found = above[span.parent_id] = operation_above(parent, service, by_id)
                operation = found
            if hops is None:
                continue
            hop = (service, operation, callee)
            w = hops.get(hop)
            if w is None:
                w = hops[hop] = HopWindow(version=resource.version)
            w.calls += 1
            ms = (span.end_ns - span.start_ns) / 1e6
            if span.status == _ERROR:  # a failed call is a duration of its hop, never a hang ...
                if timed_out(span):  # ... but a timeout is judged apart
                    w.timeout_seen = True
                    if not answer:
                        w.timeout_count += 1
                        _keep(w.timeouts, (ms, span.start_ns, trace_id))
                    continue
            else:
                judged = thresholds.get(hop)
                if judged is not None:
                    if ms > judged[0]:
                        w.hung_count += 1
                        w.threshold_ms = judged[0]
                        _keep(w.hung, (ms, span.start_ns, trace_id))
                        continue
                elif ms > floor_ms:
                    if len(w.pending) < per_window:
                        w.pending.append((ms, span.start_ns, trace_id))  # judged when its window closes
                        continue
                    self.telemetry.drop("unjudged")
            durations = w.durations
            if len(durations) < per_window:
                durations.append(ms)
            else:  # a uniform sample of the window's calls
                j = randrange(w.calls)
                if j < per_window:
                    durations[j] = ms

    def on_revoke(self, part: str) -> None:
        self._windows.each(lambda parts: parts.pop(part, None))

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for window in self._windows.close_until(watermark_ns, open_since_ns):
            try:
                out.events.extend(self._judge(window.window_id, window.start_ns, window.end_ns, window.value))
            except (ValueError, ArithmeticError) as e:  # one window's bad numbers must not stop the others
                out.quarantined.append(Quarantined(f"hang window {window.window_id}", e))
        self.telemetry.gauge("hops", len(self._recent))

    def _judge(self, window_id: str, start_ns: int, end_ns: int, parts: Parts) -> list[FindingEvent]:
        merged: dict[Hop, HopWindow] = {}
        for hops in parts.values():
            for hop, w in hops.items():
                m = merged.setdefault(hop, HopWindow(version=w.version))
                m.calls += w.calls
                m.durations += w.durations
                m.hung_count += w.hung_count
                m.timeout_count += w.timeout_count
                m.timeout_seen = m.timeout_seen or w.timeout_seen
                m.threshold_ms = max(m.threshold_ms, w.threshold_ms)
                m.pending += w.pending
                for ex in w.hung:
                    _keep(m.hung, ex)
                for ex in w.timeouts:
                    _keep(m.timeouts, ex)
        c = self.config
        found = []
        for hop, w in sorted(merged.items()):
            judged = self._thresholds.get(hop)
            _settle(w, judged[0] if judged is not None else None)
            if judged is not None and max(w.hung_count, w.timeout_count) >= c.min_calls:
                found.append(finding(hop, w, judged[1], (window_id, end_ns), c.factor, c.min_hang_s * 1e3))
                self.telemetry.count("findings")
            recent = self._recent.get(hop)
            if recent is None:
                recent = deque(maxlen=c.baseline_size)
                for gone, _ in self._recent.put(hop, recent):
                    self._thresholds.pop(gone, None)
            recent.extend(w.durations)
            if len(recent) >= c.min_baseline:
                ranked = sorted(recent)
                base = Baseline(len(ranked), _q(ranked, 0.5), _q(ranked, 0.95), _q(ranked, 0.99))
                self._thresholds[hop] = (max(c.factor * base.p99, c.min_hang_s * 1e3), base)
        return found


def _settle(w: HopWindow, threshold_ms: float | None) -> None:
    """Judge the window's calls that waited for a distribution against ``threshold_ms`` (the windows before it):
    hung past it, else a duration of the hop like the others."""
    for example in w.pending:
        if threshold_ms is not None and example[0] > threshold_ms:
            w.hung_count += 1
            w.threshold_ms = max(w.threshold_ms, threshold_ms)
            _keep(w.hung, example)
        else:
            w.durations.append(example[0])
    w.pending = []


def _q(ranked: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted values."""
    return ranked[min(len(ranked) - 1, max(0, int(q * len(ranked) + 0.999999) - 1))]


def _keep(examples: list[tuple[float, int, str]], example: tuple[float, int, str]) -> None:
    """Keep the ``MAX_EXAMPLES`` longest examples."""
    if len(examples) < MAX_EXAMPLES:
        examples.append(example)
    else:
        shortest = min(range(len(examples)), key=lambda i: examples[i][0])
        if example[0] > examples[shortest][0]:
            examples[shortest] = example
