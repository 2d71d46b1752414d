"""Windowed service statistics: per window and per (service, operation, service.version), the requests, the
errors by signature, a latency sketch, a bounded latency sample and the critical-path ownership of the slowest.

A *request* is a server span, or a root span (a job run, a client-started trace); its operation is its
``http.route`` or else its name, as the graph's ``Operation`` nodes key it. Its version is its own resource's
``service.version``: a trace that crosses services counts each service's request under that service's version.

A request fails when its span has status ERROR or an HTTP status >= 500. Its *error signature* is
``error:<label>:<exception type>``, or ``error:<label>:HTTP <status>`` for a 5xx without an exception, where the
label is the span name when it reads ``<METHOD> <route>`` and the operation otherwise (``error:POST /split:
ZeroDivisionError``). The exception is the request span's, else the one recorded deepest below it in the same
service; the function the signature happened in is that span's ``code.function.name`` (or its nearest ancestor's).

Windows are aligned on event time by the trace root's start and close like ``processors.windows``: once the
watermark is past their end plus the trace gap and no open trace started inside them. A trace for a closed window
is late: counted, left out. State per key is bounded: a reservoir of ``reservoir_size`` latencies (Algorithm R,
seeded RNG, mergeable by weighted sampling), ``slow_traces`` slowest requests (their critical paths), and
``max_signatures`` signatures (the rest fold into ``error:<label>:(other)``).
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from processors.critical_path import critical_path
from processors.graph_rows import Row
from processors.sketch import LatencySketch
from processors.traces import ClosedTrace
from processors.windows import forget_partition, ready_windows
from streamer.events import Span, SpanKind

NS_PER_MS = 1_000_000
OTHER = "(other)"


# ---- requests and their signatures ---------------------------------------------------------------------------


def request_label(span: Span) -> str:
    """``<METHOD> <route>`` when the span name says so, else the operation (route or span name)."""
    if span.route and span.name != span.route and span.name.endswith(" " + span.route):
        return span.name
    return span.route or span.name


def error_part(exception: str, http_status: int) -> str:
    """What failed: the exception type, ``HTTP <status>`` for a 5xx without one, else ``error``."""
    if exception:
        return exception
    return f"HTTP {http_status}" if http_status >= 500 else "error"


def error_signature(label: str, exception: str, http_status: int) -> str:
    """``error:<label>:<exception type>`` or ``error:<label>:HTTP <status>`` (or ``:error`` without either)."""
    return f"error:{label}:{error_part(exception, http_status)}"


@dataclass(frozen=True, slots=True)
class Request:
    """One request of one service, as the statistics, the regression detector and the proof judge count it."""

    trace_id: str
    span_id: str
    service: str
    version: str
    revision: str
    operation: str  # http.route or span name: the Operation node's name
    label: str  # "<METHOD> <route>" when known
    start_ns: int
    end_ns: int
    error: bool
    exception: str = ""
    http_status: int = 0
    signature: str = ""  # "" for a request that did not fail
    function: str = ""  # where the error was recorded

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / NS_PER_MS


def _origin(span: Span, children: dict[str, list[Span]]) -> tuple[str, str]:
    """(exception type, function) of the failure below a request span, in its own service, deepest first."""
    service = span.resource.service
    best: tuple[int, str, str] | None = None  # (depth, exception, function)
    stack: list[tuple[Span, int, str]] = [(span, 0, span.code_function)]
    seen: set[str] = set()
    while stack:
        node, depth, function = stack.pop()
        if node.span_id in seen:
            continue
        seen.add(node.span_id)
        function = node.code_function or function
        wanted = not span.exception_type or node.exception_type == span.exception_type
        if node.exception_type and wanted and (best is None or depth > best[0]):
            best = (depth, node.exception_type, function)
        for kid in children.get(node.span_id, ()):
            if kid.resource.service == service and kid.kind != SpanKind.SERVER:
                stack.append((kid, depth + 1, function))
    if best is None:
        return span.exception_type, span.code_function
    return best[1], best[2]


def requests_of(trace: ClosedTrace) -> list[Request]:
    """The requests in a closed trace: every server span and the root span."""
    out: list[Request] = []
    children: dict[str, list[Span]] | None = None
    for span in trace.spans:
        if span.kind != SpanKind.SERVER and span.parent_id:
            continue
        error = span.is_error or span.http_status >= 500
        label = request_label(span)
        exception = function = signature = ""
        if error:
            if children is None:
                children = {}
                for s in trace.spans:
                    children.setdefault(s.parent_id, []).append(s)
            exception, function = _origin(span, children)
            signature = error_signature(label, exception, span.http_status)
        r = span.resource
        out.append(Request(trace.trace_id, span.span_id, r.service, r.version, r.revision, span.route or span.name,
                           label, span.start_ns, span.end_ns, error, exception, span.http_status, signature,
                           function))  # fmt: skip
    return out


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

    def wants(self, duration_ns: int) -> bool:
        return len(self.heap) < self.size or duration_ns > self.heap[0][0]

    def add(self, duration_ns: int, span_id: str, owned: dict[str, int]) -> None:
        item = (duration_ns, span_id, owned)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, item)
        else:
            heapq.heappushpop(self.heap, item)

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

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.service, self.operation, self.version)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0


StatsKey = tuple[str, str, str]  # (service, operation, version)


@dataclass(frozen=True, slots=True)
class StatsWindow:
    """A closed statistics window."""

    window_id: str  # "<start ms>-<end ms>", like the CALLS windows
    start_ns: int
    end_ns: int
    ops: dict[StatsKey, OpStats]
    sources: frozenset[tuple[Hashable, int]]


@dataclass(slots=True)
class _Window:
    start_ns: int
    ops: dict[StatsKey, OpStats] = field(default_factory=dict)
    sources: set[tuple[Hashable, int]] = field(default_factory=set)


def site(label: str, function: str) -> str:
    return f"{label} in {function}" if function else label


class ServiceStats:
    """Per-window request statistics from closed traces; see the module docstring."""

    __slots__ = ("_closed_before", "_rng", "_windows", "counters", "grace_ns", "max_signatures", "max_sites",
                 "reservoir_size", "size_ns", "slow_traces")  # fmt: skip

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
    ) -> None:
        self.size_ns = size_ns
        self.grace_ns = grace_ns
        self.reservoir_size = reservoir_size
        self.slow_traces = slow_traces
        self.max_signatures = max_signatures
        self.max_sites = max_sites
        self._rng = random.Random(seed)
        self._windows: dict[int, _Window] = {}
        self._closed_before = 0
        self.counters = {
            "late_traces": 0,
            "windows_closed": 0,
            "requests": 0,
            "samples_dropped": 0,
            "signatures_folded": 0,
        }

    def __len__(self) -> int:
        return len(self._windows)

    def add(self, trace: ClosedTrace) -> set[tuple[Hashable, int]] | None:
        """Count the trace's requests in its window; the input sources new to it, or None for a late trace."""
        root_start = trace.root.start_ns
        start = root_start - root_start % self.size_ns
        if start < self._closed_before:
            self.counters["late_traces"] += 1
            return None
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = _Window(start)
        new_sources = trace.sources - window.sources
        window.sources.update(new_sources)
        for req in requests_of(trace):
            self._count(window, req, trace)
        return set(new_sources)

    def _count(self, window: _Window, req: Request, trace: ClosedTrace) -> None:
        key = (req.service, req.operation, req.version)
        op = window.ops.get(key)
        if op is None:
            op = window.ops[key] = OpStats(req.service, req.operation, req.version, req.label, req.revision,
                                           samples=Reservoir(self.reservoir_size), slow=SlowTraces(self.slow_traces),
                                           first_ns=req.start_ns)  # fmt: skip
        self.counters["requests"] += 1
        op.requests += 1
        op.first_ns = min(op.first_ns, req.start_ns)
        op.revision = op.revision or req.revision
        ms = req.duration_ms
        op.latency.add(ms)
        if not op.samples.add(ms, self._rng):
            self.counters["samples_dropped"] += 1
        duration = req.end_ns - req.start_ns
        if op.slow.wants(duration):
            start = next(s for s in trace.spans if s.span_id == req.span_id)
            op.slow.add(duration, req.span_id, critical_path(trace.spans, start))
        if req.error:
            op.errors += 1
            sig = req.signature
            if sig not in op.signatures and len(op.signatures) >= self.max_signatures:
                self.counters["signatures_folded"] += 1
                sig = error_signature(req.label, OTHER, 0)
            op.signatures[sig] = op.signatures.get(sig, 0) + 1
            places = op.sites.setdefault(sig, {})
            where = site(req.label, req.function)
            if where in places or len(places) < self.max_sites:
                places[where] = places.get(where, 0) + 1

    def close_until(self, watermark_ns: int, open_since_ns: int | None = None) -> list[StatsWindow]:
        """Close windows past ``end + grace``, but none that a still-open trace (started at ``open_since_ns``)
        may yet contribute to."""
        ready = ready_windows(self._windows, watermark_ns, self.size_ns, self.grace_ns, open_since_ns)
        if ready:
            self._closed_before = max(self._closed_before, ready[-1] + self.size_ns)
        return [self._emit(s) for s in ready]

    def forget_source(self, tp: Hashable) -> None:
        forget_partition(self._windows.values(), tp)

    def _emit(self, start: int) -> StatsWindow:
        w = self._windows.pop(start)
        self.counters["windows_closed"] += 1
        for op in w.ops.values():
            # The sketch reads a quantile back within (gamma - 1) / 2 of its true value: widen the cut by as much.
            p95_ns = op.latency.quantile(0.95) * NS_PER_MS * (1 - 0.5 * (op.latency.gamma - 1))
            op.path_ns, op.path_traces = op.slow.ownership(p95_ns)
        end = start + self.size_ns
        wid = f"{start // NS_PER_MS}-{end // NS_PER_MS}"
        return StatsWindow(wid, start, end, w.ops, frozenset(w.sources))


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
    out.samples = Reservoir.merged([p.samples for p in items], reservoir_size, rng)
    return out


# ---- graph rows ----------------------------------------------------------------------------------------------

STATS_STATEMENT = (
    "UNWIND $rows AS r "
    "MERGE (s:Service {name: r.service}) "
    "MERGE (o:Operation {key: r.operation_key}) ON CREATE SET o.service = r.service, o.name = r.operation "
    "MERGE (s)-[:EXPOSES]->(o) "
    "MERGE (w:Window {id: r.window}) ON CREATE SET w.start = r.start, w.end = r.end "
    "MERGE (o)-[x:STATS {window: r.window, version: r.version}]->(w) "
    "SET x.revision = r.revision, x.requests = r.requests, x.errors = r.errors, x.error_rate = r.error_rate, "
    "x.p50_ms = r.p50_ms, x.p95_ms = r.p95_ms, x.p99_ms = r.p99_ms, x.signatures = r.signatures, "
    "x.critical_path = r.critical_path"
)


def stats_rows(window: StatsWindow) -> list[Row]:
    """Parameter rows of ``STATS_STATEMENT``: one ``(:Operation)-[:STATS]->(:Window)`` edge per key."""
    rows: list[Row] = []
    for (service, operation, version), op in sorted(window.ops.items()):
        total = sum(op.path_ns.values())
        path = {k: round(v / total, 4) for k, v in sorted(op.path_ns.items())} if total else {}
        rows.append(
            {
                "service": service,
                "operation": operation,
                "operation_key": operation_key_of(service, operation),
                "window": window.window_id,
                "start": window.start_ns / NS_PER_MS,
                "end": window.end_ns / NS_PER_MS,
                "version": version,
                "revision": op.revision,
                "requests": op.requests,
                "errors": op.errors,
                "error_rate": round(op.error_rate, 6),
                "p50_ms": _finite(op.latency.quantile(0.5)),
                "p95_ms": _finite(op.latency.quantile(0.95)),
                "p99_ms": _finite(op.latency.quantile(0.99)),
                "signatures": json.dumps(op.signatures, sort_keys=True),
                "critical_path": json.dumps(path, sort_keys=True),
            }
        )
    return rows


def operation_key_of(service: str, operation: str) -> str:
    """The graph's Operation key from its parts: what ``processors.graph_rows.operation_key`` makes of a span."""
    return f"{service}:{operation}"


def _finite(v: float) -> float:
    return round(v, 3) if math.isfinite(v) else 0.0
