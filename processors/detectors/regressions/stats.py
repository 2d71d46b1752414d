"""Windowed service statistics: per window and per (service, operation, service.version), the requests, the
errors by signature, a latency sketch, a bounded latency sample and the critical-path ownership of the slowest.

Requests and their signatures are ``processors.pipeline.requests``'. Windows are the shared tumbling-window helper,
aligned on the trace root's start and closed like the CALLS windows: once the watermark is past their end plus the trace
gap and no open trace started inside them. A trace for a closed window is late: counted (``stats_late``), left out.
State per key is bounded: a reservoir of ``reservoir_size`` latencies (Algorithm R, seeded RNG, mergeable by
weighted sampling), ``slow_traces`` slowest requests (their critical paths), and ``max_signatures`` signatures (the
rest fold into ``error:<label>:(other)``).
"""

from __future__ import annotations

import heapq
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.lib.sketch import LatencySketch
from processors.model.graph import Row
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS
from processors.pipeline.critical_path import critical_path
from processors.pipeline.requests import Request, error_signature, operation_key_of, requests_of, site
from processors.state.windows import ClosedWindow, TumblingWindows

OTHER = "(other)"


# ---- bounded samples -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Reservoir:
    """A uniform sample of at most ``size`` values of all ``seen`` (Algorithm R)."""

    size: int
    values: list[float] = field(default_factory=list)
    seen: int = 0

    def add(self, value: float, rng: random.Random) -> bool:
        """Offer one value; False when it was not kept (the sample is full and it lost the draw)."""
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return True
        j = rng.randrange(self.seen)
        if j < self.size:
            self.values[j] = value
        return False

    @staticmethod
    def merged(parts: Sequence[Reservoir], size: int, rng: random.Random) -> Reservoir:
        """A sample of the union: each part's values weigh ``seen / len(values)`` (A-Res weighted sampling)."""
        keyed: list[tuple[float, float]] = []
        for part in parts:
            if not part.values:
                continue
            weight = part.seen / len(part.values)
            keyed.extend((rng.random() ** (1.0 / weight), v) for v in part.values)
        chosen = heapq.nlargest(size, keyed) if len(keyed) > size else keyed
        return Reservoir(size, [v for _, v in chosen], sum(p.seen for p in parts))


@dataclass(slots=True)
class SlowTraces:
    """The ``size`` slowest requests and the critical-path ownership (ns per owner) of each."""

    size: int
    heap: list[tuple[int, str, dict[str, int]]] = field(default_factory=list)  # (duration ns, span id, owned)
    ids: set[str] = field(default_factory=set)  # the span ids in ``heap``

    def wants(self, duration_ns: int, span_id: str = "") -> bool:
        """Whether a request this long would be kept (not one already kept: a trace delivered and closed twice)."""
        return (len(self.heap) < self.size or duration_ns > self.heap[0][0]) and span_id not in self.ids

    def add(self, duration_ns: int, span_id: str, owned: dict[str, int]) -> None:
        if span_id in self.ids:
            return  # the same request again (a trace delivered twice and closed twice): kept once
        item = (duration_ns, span_id, owned)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        elif (out := heapq.heappushpop(self.heap, item)) is not item:
            self.ids.discard(out[1])
        else:
            return
        self.ids.add(span_id)

    def ownership(self, threshold_ns: float) -> tuple[dict[str, int], int]:
        """Summed ownership of the kept requests at or above ``threshold_ns`` (at least the slowest one)."""
        picked = [h for h in self.heap if h[0] >= threshold_ns] or heapq.nlargest(1, self.heap)
        total: dict[str, int] = {}
        for _, _, owned in picked:
            for k, v in owned.items():
                total[k] = total.get(k, 0) + v
        return total, len(picked)


# ---- windows -------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class OpStats:
    """One (service, operation, version) in one window, or merged over several."""

    service: str
    operation: str
    version: str
    label: str = ""
    revision: str = ""
    requests: int = 0
    errors: int = 0
    signatures: dict[str, int] = field(default_factory=dict)
    sites: dict[str, dict[str, int]] = field(default_factory=dict)  # signature -> "label in function" -> count
    latency: LatencySketch = field(default_factory=LatencySketch)
    samples: Reservoir = field(default_factory=lambda: Reservoir(0))
    slow: SlowTraces = field(default_factory=lambda: SlowTraces(0))
    first_ns: int = 0
    # Filled when the window closes: critical-path ns per owner over the slowest (p95+) requests.
    path_ns: dict[str, int] = field(default_factory=dict)
    path_traces: int = 0
    sampled: dict[str, int] = field(default_factory=dict)  # sampling label -> requests (detectors.regressions.sampling)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.service, self.operation, self.version)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


StatsKey = tuple[str, str, str]  # (service, operation, version)
MAX_SAMPLING_LABELS = 8  # sampling probabilities counted apart per key and window
Ops = dict[StatsKey, OpStats]
Parts = dict[str, Ops]  # input partition -> its statistics in the window (see processors.pipeline.calls)


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """A closed statistics window: per input partition (the graph's contributions) and merged (what is tested)."""

    window_id: str  # "<start ms>-<end ms>", like the CALLS windows
    start_ns: int
    end_ns: int
    ops: Ops
    parts: Parts = field(default_factory=dict)


class ServiceStats:
    """Per-window request statistics from closed traces; see the module docstring."""

    __slots__ = ("_rng", "_windows", "max_signatures", "max_sites", "reservoir_size", "slow_traces", "telemetry")

    def __init__(
        self,
        size_ns: int,
        grace_ns: int,
        *,
        reservoir_size: int = 256,
        slow_traces: int = 32,
        max_signatures: int = 64,
        max_sites: int = 16,
        seed: int = 0,
        max_windows: int = 1_000,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.reservoir_size = reservoir_size
        self.slow_traces = slow_traces
        self.max_signatures = max_signatures
        self.max_sites = max_sites
        self._rng = random.Random(seed)
        self.telemetry = (telemetry or Telemetry("stats")).declare("max_signatures", "max_sites", "max_sampling_labels")
        self._windows: TumblingWindows[Parts] = TumblingWindows(
            "stats",
            size_ns,
            grace_ns,
            lambda _start: {},
            max_windows=max_windows,
            telemetry=self.telemetry,
            events=events,
        )

    def __len__(self) -> int:
        return len(self._windows)

    def add(self, trace: ClosedTrace) -> bool:
        """Count the trace's requests in its root's window; False (counted late) when that window has closed.
        (One loop over the trace's requests: it runs for every request stage 1 sees.)"""
        parts = self._windows.at(trace.root.start_ns)
        if parts is None:
            return False
        ops = parts.setdefault(trace.part, {})
        requests = requests_of(trace)
        self.telemetry.count("requests", len(requests))
        rng = self._rng
        replaced = 0  # samples replaced (by design: the reservoir keeps a uniform sample), counted once a trace
        for req in requests:
            key = (req.service, req.operation, req.version)
            op = ops.get(key)
            if op is None:
                op = ops[key] = self._new(req)
            op.requests += 1
            label = req.sampling.label
            sampled = op.sampled
            if label not in sampled and len(sampled) >= MAX_SAMPLING_LABELS:
                self.telemetry.drop("max_sampling_labels")  # folded into one label: a mix either way
                label = "(other)"
            sampled[label] = sampled.get(label, 0) + 1
            start_ns = req.start_ns
            if start_ns < op.first_ns:
                op.first_ns = start_ns
            if not op.revision:
                op.revision = req.revision
            duration = req.end_ns - start_ns
            ms = duration / MS_NS  # (``Request.duration_ms``)
            op.latency.add(ms)
            if not op.samples.add(ms, rng):
                replaced += 1
            slow, span_id = op.slow, req.span_id
            if slow.wants(duration, span_id):
                facts = trace.facts
                start = facts.by_id[span_id] if facts.unique else next(s for s in trace.spans if s.span_id == span_id)
                slow.add(duration, span_id, critical_path(trace.spans, start, facts.by_end, unique=facts.unique))
            if req.error:
                self._error(op, req)
        self.telemetry.count("samples_replaced", replaced)
        return True

    def _new(self, req: Request) -> OpStats:
        return OpStats(req.service, req.operation, req.version, req.label, req.revision,
                       samples=Reservoir(self.reservoir_size), slow=SlowTraces(self.slow_traces),
                       first_ns=req.start_ns)  # fmt: skip

    def _error(self, op: OpStats, req: Request) -> None:
        """Count a failed request under its signature (bounded) and where it failed (bounded)."""
        op.errors += 1
        sig = req.signature
        if sig not in op.signatures and len(op.signatures) >= self.max_signatures:
            self.telemetry.drop("max_signatures")  # folded into "(other)"
            sig = error_signature(req.label, OTHER, 0)
        op.signatures[sig] = op.signatures.get(sig, 0) + 1
        places = op.sites.setdefault(sig, {})
        where = site(req.label, req.function)
        if where in places or len(places) < self.max_sites:
            places[where] = places.get(where, 0) + 1
        else:
            self.telemetry.drop("max_sites")

    def close_until(self, watermark_ns: int, open_since_ns: int | None = None) -> list[StatsWindow]:
        """Close windows past ``end + grace``, but none that a still-open trace (started at ``open_since_ns``)
        may yet contribute to."""
        return [self._emit(w) for w in self._windows.close_until(watermark_ns, open_since_ns)]

    def forget_part(self, part: str) -> None:
        """A revoked input partition: its contributions to open windows go (its next owner replays them)."""
        self._windows.each(lambda parts: parts.pop(part, None))

    def _emit(self, window: ClosedWindow[Parts]) -> StatsWindow:
        for ops in window.value.values():
            for op in ops.values():
                # The sketch reads a quantile back within (gamma - 1) / 2 of its true value: widen the cut as much.
                p95_ns = op.latency.quantile(0.95) * MS_NS * (1 - 0.5 * (op.latency.gamma - 1))
                op.path_ns, op.path_traces = op.slow.ownership(p95_ns)
        merged = merge_parts(window.value, self._rng, self.reservoir_size)
        return StatsWindow(window.window_id, window.start_ns, window.end_ns, merged, window.value)


def merge_parts(parts: Parts, rng: random.Random, reservoir_size: int) -> Ops:
    """A window's statistics over all its input partitions."""
    if len(parts) == 1:
        [merged] = parts.values()
        return merged
    out: Ops = {}
    for key in sorted({k for ops in parts.values() for k in ops}):
        total = merge([ops[key] for ops in parts.values() if key in ops], rng, reservoir_size)
        if total is not None:
            out[key] = total
    return out


def merge(parts: Iterable[OpStats], rng: random.Random, reservoir_size: int) -> OpStats | None:
    """Several windows of one key (or of one operation across windows) summed; None when there is none."""
    items = [p for p in parts if p.requests]
    if not items:
        return None
    head = items[-1]
    out = OpStats(head.service, head.operation, head.version, head.label, head.revision,
                  first_ns=min(p.first_ns for p in items))  # fmt: skip
    for p in items:
        out.requests += p.requests
        out.errors += p.errors
        for sig, n in p.signatures.items():
            out.signatures[sig] = out.signatures.get(sig, 0) + n
        for sig, places in p.sites.items():
            mine = out.sites.setdefault(sig, {})
            for where, n in places.items():
                mine[where] = mine.get(where, 0) + n
        out.latency.merge(p.latency)
        for k, v in p.path_ns.items():
            out.path_ns[k] = out.path_ns.get(k, 0) + v
        out.path_traces += p.path_traces
        for label, n in p.sampled.items():
            out.sampled[label] = out.sampled.get(label, 0) + n
    out.samples = Reservoir.merged([p.samples for p in items], reservoir_size, rng)
    return out


# ---- graph rows ----------------------------------------------------------------------------------------------


def stats_rows(window: StatsWindow) -> list[Row]:
    """Parameter rows of the ``stats`` upsert: one contribution per (operation, version, input partition); the
    graph sums them into the ``(:Operation)-[:STATS]->(:Window)`` edge (``processors.lib.parts``)."""
    rows: list[Row] = []
    for part, ops in sorted(window.parts.items()):
        for (service, operation, version), op in sorted(ops.items()):
            rows.append(
                {
                    "service": service,
                    "operation": operation,
                    "operation_key": operation_key_of(service, operation),
                    "window": window.window_id,
                    "start": window.start_ns / MS_NS,
                    "end": window.end_ns / MS_NS,
                    "version": version,
                    "part": part,
                    "revision": op.revision,
                    "requests": op.requests,
                    "errors": op.errors,
                    "signatures": json.dumps(op.signatures, sort_keys=True),
                    "path_ns": json.dumps(op.path_ns, sort_keys=True),
                    **op.latency.to_row(),
                }
            )
    return rows
