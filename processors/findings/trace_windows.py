"""What the per-trace performance detectors share: windows of tallies per fingerprint, requests, statement shapes.

A per-trace detector (``n_plus_one``, ``fanout``, ``retry_storm``) reads each closed trace once and finds what one
request did wrong; people need the defect, not every request that showed it. So each occurrence is folded into a
:class:`Tally` of its fingerprint in the tumbling window its trace's root starts in (the shared event-time windows,
closed once the watermark is past their end plus the trace gap), one contribution per input partition as the
CALLS aggregates keep them (a revoked partition's contributions go, its next owner replays them). Every window also
counts the requests of each (service, operation), so that a finding says how many of its route's requests it hit.

Bounds (counted when hit): ``max_fingerprints`` tallies per window and partition (``max_fingerprints``),
``max_operations`` request counters (``max_operations``) and as many counters of traffic without a defect
(``max_counters``), ``max_points`` chart points and example traces per tally.

:func:`statement_shape` is the statement text with its literals and placeholders masked (``?``), IN lists folded
and whitespace and case normalised: what stays the same when a loop runs one query with different values. It masks
tokens, it does not parse (the detectors run at daemon start without sqlglot, and a shape only groups statements).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final

from processors.api.component import Emit, Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.model.events import SpanKind, StatusCode
from processors.model.finding import FindingEvent
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS
from processors.pipeline.requests import requests_of
from processors.state.lru import CountedLRU
from processors.state.windows import TumblingWindows

_ERROR: Final = StatusCode.ERROR

# ---- statement shapes ----------------------------------------------------------------------------------------

_LITERAL: Final = re.compile(
    r"""'(?:[^']|'')*'"""  # 'string' ('' escapes)
    r"""|\$\d+|%\(\w+\)s|%s|(?<![:\w]):[A-Za-z_]\w*|\?"""  # placeholders: $1 %(name)s %s :name ?
    r"""|(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?(?![\w.])""",  # numbers not inside names
    re.IGNORECASE,
)
_LIST: Final = re.compile(r"\(\s*\?(?:\s*,\s*\?)*\s*\)")  # (?, ?, ?) -> (?)
_VALUES: Final = re.compile(r"(\(\?\))(?:\s*,\s*\(\?\))+")  # VALUES (?), (?) -> VALUES (?)
_SPACE: Final = re.compile(r"\s+")
MAX_SHAPE_CHARS: Final = 2_000  # a longer statement is grouped by its first characters


def statement_shape(statement: str) -> str:
    """The statement with literals and placeholders masked and lists folded, lower case, one space per run."""
    text = _LITERAL.sub("?", statement[: MAX_SHAPE_CHARS * 2])
    text = _VALUES.sub(r"\1", _LIST.sub("(?)", text))
    return _SPACE.sub(" ", text).strip().rstrip(";").strip().lower()[:MAX_SHAPE_CHARS]


class Shapes:
    """Statement shapes by statement text, remembered in a counted LRU (``shape_cache``): a loop sends one text."""

    __slots__ = ("_known",)

    def __init__(self, capacity: int, telemetry: Telemetry) -> None:
        self._known: CountedLRU[str, str] = CountedLRU(capacity, telemetry, "shape_cache")

    def of(self, statement: str) -> str:
        shape = self._known.get(statement)
        if shape is None:
            shape = statement_shape(statement)
            self._known.put(statement, shape)
        return shape


def statement_verb(shape: str) -> str:
    """The statement's first keyword (``select``, ``insert``...; after a leading WITH: the main one when it says)."""
    words = shape.split(" ", 1)
    return words[0] if words else ""


# ---- requests and calls ----------------------------------------------------------------------------------------


def is_request(span: Span) -> bool:
    """A request span as ``processors.pipeline.requests`` counts them: a server span or the root."""
    return span.kind == SpanKind.SERVER or not span.parent_id


def request_above(span: Span, by_id: dict[str, Span]) -> Span | None:
    """The request ``span`` belongs to: its nearest server (or root) ancestor, itself excluded; None when unknown."""
    seen = 0
    node = by_id.get(span.parent_id)
    while node is not None and seen < 10_000:
        if is_request(node):
            return node
        node = by_id.get(node.parent_id)
        seen += 1
    return None


def operation_of(request: Span) -> str:
    """A request's operation as the graph's Operation nodes name it: its ``http.route``, else its span name."""
    return request.detail.route or request.name


def dependency_of(call: Span, servers: dict[str, Span], shapes: Shapes) -> tuple[str, str]:
    """What a CLIENT span calls: (dependency, operation). A database call is its system (and namespace) and its
    statement's shape (or span name); a call another service answered is that service and the route it served
    (``servers``: the server span under each client span, by the client's span id); else the span's own name."""
    db = call.detail.db
    if db is not None:
        system = db.system or "db"
        dependency = f"{system}/{db.namespace}" if db.namespace else system
        return dependency, shapes.of(db.statement) if db.statement else call.name
    server = servers.get(call.span_id)
    if server is not None:
        return server.resource.service, operation_of(server)
    return call.name, call.name


def servers_below(spans: Iterable[Span]) -> dict[str, Span]:
    """The server span answering each client span, by the client's span id."""
    return {s.parent_id: s for s in spans if s.kind == SpanKind.SERVER and s.parent_id}


def failed(call: Span) -> bool:
    """A call that failed: status ERROR, or an HTTP status of 5xx or 429 (told to come back later)."""
    if call.status == _ERROR:
        return True
    status = call.detail.http_status  # (``detail``, a slot: this runs for every call of every trace)
    return status >= 500 or status == 429


def held_ns(calls: Iterable[Span], path: dict[str, int], spans: Iterable[Span]) -> int:
    """What ``calls`` and everything under them hold of a request's critical path (``path``: ns per span id, from
    ``processors.pipeline.critical_path.on_path``): a call's time is its own and its callee's."""
    children: dict[str, list[str]] = {}
    for s in spans:
        if s.parent_id:
            children.setdefault(s.parent_id, []).append(s.span_id)
    total = 0
    stack = [c.span_id for c in calls]
    seen: set[str] = set()
    while stack:
        sid = stack.pop()
        if sid in seen:
            continue
        seen.add(sid)
        total += path.get(sid, 0)
        stack.extend(children.get(sid, ()))
    return total


def max_overlap(intervals: Iterable[tuple[int, int]]) -> int:
    """The most intervals open at one instant (one ending as another starts does not overlap it)."""
    edges = sorted(e for lo, hi in intervals for e in ((lo, 1), (hi, -1)))
    depth = best = 0
    for _, step in edges:  # at equal times the end (-1) sorts first
        depth += step
        best = max(best, depth)
    return best


def union_ns(intervals: Iterable[tuple[int, int]]) -> int:
    """The length of the union of the intervals: the wall time they took together."""
    total = 0
    cur_lo = cur_hi = None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None and cur_lo is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None and cur_lo is not None:
        total += cur_hi - cur_lo
    return total


# ---- windows of tallies ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """One fingerprint in one window (of one input partition, or merged): its subject, how many requests showed it
    and how often, the per-request values its chart draws, example traces and sums a detector keeps by name."""

    service: str
    operation: str
    entity: str
    version: str
    requests: int = 0
    occurrences: int = 0
    first_ns: int = 0
    last_ns: int = 0
    points: list[tuple[float, float]] = field(default_factory=list)  # (request start ms, value)
    traces: list[str] = field(default_factory=list)
    sums: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)  # of the worst occurrence (its parent operation, ...)
    profile: list[tuple[float, float]] = field(default_factory=list)  # a chart of the worst occurrence

    def add(self, trace_id: str, at_ns: int, value: float, *, max_points: int, occurrences: int = 1) -> None:
        """Count one request that showed the defect ``occurrences`` times, at ``at_ns``, charting ``value``."""
        self.requests += 1
        self.occurrences += occurrences
        self.first_ns = min(self.first_ns, at_ns) if self.first_ns else at_ns
        self.last_ns = max(self.last_ns, at_ns)
        if len(self.points) < max_points:
            self.points.append((at_ns / MS_NS, value))
        if len(self.traces) < 20 and trace_id not in self.traces:
            self.traces.append(trace_id)

    def total(self, name: str, value: float) -> None:
        self.sums[name] = self.sums.get(name, 0.0) + value

    def peak(self, name: str, value: float) -> bool:
        """Keep the largest ``value`` of ``name``; True when this one is it (the caller then keeps its facts)."""
        if name in self.peaks and self.peaks[name] >= value:
            return False
        self.peaks[name] = value
        return True


def merged(parts: list[Tally], max_points: int) -> Tally:
    """One fingerprint's tallies of several input partitions as one."""
    if len(parts) == 1:
        return parts[0]
    head = parts[0]
    out = Tally(head.service, head.operation, head.entity, head.version, facts=dict(head.facts))
    for p in parts:
        out.requests += p.requests
        out.occurrences += p.occurrences
        out.first_ns = min(out.first_ns, p.first_ns) if out.first_ns else p.first_ns
        out.last_ns = max(out.last_ns, p.last_ns)
        out.points.extend(p.points[: max_points - len(out.points)])
        out.traces.extend(t for t in p.traces[: 20 - len(out.traces)] if t not in out.traces)
        for k, v in p.sums.items():
            out.total(k, v)
        for k, v in p.peaks.items():
            if out.peak(k, v) and p.facts:
                out.facts, out.profile = dict(p.facts), list(p.profile)
    out.points.sort()
    return out


@dataclass(slots=True)
class PartWindow:
    """One input partition's contribution to a window: request counts, tallies by what names the defect and, apart
    from them, counters by the same names of traffic that showed no defect (a dependency's calls): counting them
    never crowds a defect's tally out of its bound."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)  # (service, operation) -> requests
    tallies: dict[tuple[str, ...], Tally] = field(default_factory=dict)  # by what names the defect
    counts: dict[tuple[str, ...], list[float]] = field(default_factory=dict)  # summed element by element


@dataclass(frozen=True, slots=True)
class WindowFindings:
    """A closed window: its id and bounds, each fingerprint's merged tally, requests per (service, operation)."""

    window_id: str
    start_ns: int
    end_ns: int
    parts: tuple[str, ...]
    tallies: dict[str, Tally]
    requests: dict[tuple[str, str], int]
    counts: dict[str, list[float]] = field(default_factory=dict)  # by fingerprint


class TallyWindows:
    """Tallies per fingerprint per event-time window; see the module docstring."""

    __slots__ = ("_windows", "finding_type", "max_fingerprints", "max_operations", "max_points", "telemetry")

    def __init__(self, name: str, finding_type: str, size_ns: int, grace_ns: int, *, max_fingerprints: int,
                 max_operations: int, max_points: int, max_windows: int = 1_000, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self.finding_type = finding_type
        self.max_fingerprints = max_fingerprints
        self.max_operations = max_operations
        self.max_points = max_points
        self.telemetry = (telemetry or Telemetry(name)).declare("max_fingerprints", "max_operations", "max_counters")
        self._windows: TumblingWindows[dict[str, PartWindow]] = TumblingWindows(
            name, size_ns, grace_ns, lambda _start: {}, max_windows=max_windows, telemetry=self.telemetry,
            events=events,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self._windows)

    def window(self, trace: ClosedTrace) -> PartWindow | None:
        """The trace's partition's share of the window its root starts in (None: closed already, counted late);
        its requests are counted there."""
        root = trace.facts.root  # (``trace.root`` less a call: it runs for every trace; that raises without a root)
        parts = self._windows.at((root or trace.root).start_ns)
        if parts is None:
            return None
        part = parts.get(trace.part)
        if part is None:
            part = parts[trace.part] = PartWindow()
        counts = part.requests
        for request in requests_of(trace):  # computed once per trace for every detector that asks
            key = (request.service, request.operation)
            n = counts.get(key)  # (one lookup of a known key: a tuple's hash is not kept)
            if n is not None:
                counts[key] = n + 1
            elif len(counts) < self.max_operations:
                counts[key] = 1
            else:
                self.telemetry.drop("max_operations")
        return part

    def tally(self, part: PartWindow, key: tuple[str, ...], make: Callable[[], Tally]) -> Tally | None:
        """The tally of the defect ``key`` names (its fingerprint's parts) in ``part``, made on first use, or None
        past ``max_fingerprints`` (counted)."""
        found = part.tallies.get(key)
        if found is None:
            if len(part.tallies) >= self.max_fingerprints:
                self.telemetry.drop("max_fingerprints")
                return None
            found = part.tallies[key] = make()
        return found

    def count(self, part: PartWindow, key: tuple[str, ...], *values: float) -> None:
        """Add ``values`` to the counters of ``key`` in ``part`` (element by element, always as many); past
        ``max_operations`` keys, dropped (counted)."""
        counters = part.counts.get(key)
        if counters is None:
            if len(part.counts) >= self.max_operations:
                self.telemetry.drop("max_counters")
                return
            part.counts[key] = list(values)
            return
        for i, v in enumerate(values):
            counters[i] += v

    def forget_part(self, part: str) -> None:
        """A revoked input partition: its contributions to open windows go (its next owner replays them)."""
        self._windows.each(lambda parts: parts.pop(part, None))

    def close_until(self, watermark_ns: int, open_since_ns: int | None) -> list[WindowFindings]:
        """Windows that may close, each fingerprint's tallies merged over the input partitions."""
        out = []
        for w in self._windows.close_until(watermark_ns, open_since_ns):
            by_fp: dict[str, list[Tally]] = {}
            requests: dict[tuple[str, str], int] = {}
            counts: dict[str, list[float]] = {}
            defects = {key for part in w.value.values() for key in part.tallies}  # only their counters are read
            for _, part in sorted(w.value.items()):
                for key, t in part.tallies.items():
                    by_fp.setdefault(fingerprint_of(self.finding_type, *key), []).append(t)
                for key, n in part.requests.items():
                    requests[key] = requests.get(key, 0) + n
                for key, values in part.counts.items():
                    if key in defects:
                        fp = fingerprint_of(self.finding_type, *key)
                        mine = counts.get(fp)
                        counts[fp] = (
                            list(values) if mine is None else [a + b for a, b in zip(mine, values, strict=True)]
                        )
            tallies = {fp: merged(ts, self.max_points) for fp, ts in sorted(by_fp.items())}
            out.append(WindowFindings(w.window_id, w.start_ns, w.end_ns, tuple(sorted(w.value)), tallies, requests,
                                      counts))  # fmt: skip
        return out


def fingerprint_of(finding_type: str, *parts: str) -> str:
    """A fingerprint stable across deploys: the type and what names the defect (never a version or a time)."""
    return hashlib.sha256("\x1f".join((finding_type, *parts)).encode()).hexdigest()[:16]


def occurrence_of(fingerprint: str, window: WindowFindings) -> str:
    """One window's occurrence of a fingerprint, the same on every replay of the same input partitions."""
    return hashlib.sha256("|".join((fingerprint, window.window_id, *window.parts)).encode()).hexdigest()[:16]


Build = Callable[[WindowFindings, str, Tally], FindingEvent | None]


def emit_closed(windows: TallyWindows, watermark_ns: int, open_since_ns: int | None, out: Emit, build: Build) -> int:
    """Close the windows that may close and publish what ``build`` makes of each fingerprint's tally (None: below
    the detector's thresholds). A tally whose building raises is quarantined, the others still emitted. Returns
    how many findings were emitted."""
    emitted = 0
    for window in windows.close_until(watermark_ns, open_since_ns):
        for fingerprint, tally in window.tallies.items():
            try:
                event = build(window, fingerprint, tally)
            except Exception as error:  # one tally's defect must not lose the window's other findings
                out.quarantined.append(Quarantined(f"finding {fingerprint} of window {window.window_id}", error))
                continue
            if event is not None:
                out.events.append(event)
                emitted += 1
    return emitted
