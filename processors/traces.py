"""Trace assembly in event time: spans gather per trace until the trace has been quiet for ``gap``.

Closing is driven by the watermark (``close_until``), never by the wall clock. State is bounded: at most
``max_open`` traces (the oldest is closed early, counted as ``forced``) and ``max_spans`` spans per trace (the
excess is dropped, counted). A span for a trace closed recently is *late*: it is counted and assembled again
(its writes are idempotent).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from streamer.events import Span


@dataclass(slots=True)
class _OpenTrace:
    spans: list[Span] = field(default_factory=list)
    span_ids: set[str] = field(default_factory=set)  # a redelivered message must not double the trace
    sources: set[tuple[Hashable, int]] = field(default_factory=set)
    last_ns: int = 0
    first_ns: int = 0
    late: bool = False


@dataclass(frozen=True, slots=True)
class ClosedTrace:
    """A trace whose spans are (as far as event time can tell) complete."""

    trace_id: str
    spans: tuple[Span, ...]
    sources: frozenset[tuple[Hashable, int]]
    late: bool = False  # reassembled after it had closed once
    forced: bool = False  # closed early by the open-trace bound

    @property
    def root(self) -> Span:
        """The root span, or the earliest span when the root is missing."""
        for s in self.spans:
            if not s.parent_id:
                return s
        return min(self.spans, key=lambda s: s.start_ns)

    @property
    def start_ns(self) -> int:
        return min(s.start_ns for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.spans)


class TraceAssembler:
    __slots__ = (
        "_closed_recently",
        "_deadlines",
        "_open",
        "_remember",
        "_starts",
        "counters",
        "gap_ns",
        "max_open",
        "max_spans",
    )

    def __init__(self, gap_ns: int, max_open: int, max_spans: int, remember_closed: int = 100_000) -> None:
        self.gap_ns = gap_ns
        self.max_open = max_open
        self.max_spans = max_spans
        self._open: dict[str, _OpenTrace] = {}
        self._deadlines: list[tuple[int, str]] = []  # (last_ns + gap, trace_id), lazily invalidated
        self._starts: list[tuple[int, str]] = []  # (first span start, trace_id), lazily invalidated
        self._closed_recently: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_closed
        self.counters = {
            "spans": 0,
            "late_spans": 0,
            "dropped_spans": 0,
            "duplicate_spans": 0,
            "forced_closes": 0,
            "closed": 0,
        }

    def __len__(self) -> int:
        return len(self._open)

    def add(self, spans: Iterable[Span], source: tuple[Hashable, int]) -> tuple[list[ClosedTrace], int]:
        """Add one message's spans.

        Returns the traces closed early by the ``max_open`` bound, and how many open traces took ``source`` as a
        new input (the number of references the caller pins on it).
        """
        forced: list[ClosedTrace] = []
        new_refs = 0
        for span in spans:
            trace = self._open.get(span.trace_id)
            if trace is None:
                if len(self._open) >= self.max_open:
                    forced.append(self._force_oldest())
                # Every open trace gets a deadline, even when its first span has no end time (end_ns 0).
                trace = self._open[span.trace_id] = _OpenTrace(last_ns=span.end_ns, first_ns=span.start_ns)
                heapq.heappush(self._deadlines, (span.end_ns + self.gap_ns, span.trace_id))
                heapq.heappush(self._starts, (span.start_ns, span.trace_id))
                if span.trace_id in self._closed_recently:
                    trace.late = True
                    self.counters["late_spans"] += 1
            if span.span_id in trace.span_ids:
                self.counters["duplicate_spans"] += 1
                if source not in trace.sources:  # a replayed message still feeds this open trace: pin it too
                    trace.sources.add(source)
                    new_refs += 1
                continue
            if len(trace.spans) >= self.max_spans:
                self.counters["dropped_spans"] += 1
                continue
            trace.spans.append(span)
            trace.span_ids.add(span.span_id)
            if span.start_ns < trace.first_ns:
                trace.first_ns = span.start_ns
                heapq.heappush(self._starts, (span.start_ns, span.trace_id))
            if source not in trace.sources:
                trace.sources.add(source)
                new_refs += 1
            self.counters["spans"] += 1
            if span.end_ns > trace.last_ns:
                trace.last_ns = span.end_ns
                heapq.heappush(self._deadlines, (span.end_ns + self.gap_ns, span.trace_id))
        return forced, new_refs

    def close_until(self, watermark_ns: int) -> list[ClosedTrace]:
        """Close every trace whose last span ended more than ``gap`` before the watermark."""
        closed = []
        while self._deadlines and self._deadlines[0][0] <= watermark_ns:
            deadline, trace_id = heapq.heappop(self._deadlines)
            trace = self._open.get(trace_id)
            if trace is None or trace.last_ns + self.gap_ns != deadline:
                continue  # closed already, or extended by a later span (a newer deadline is queued)
            closed.append(self._close(trace_id, forced=False))
        return closed

    def oldest_start(self) -> int | None:
        """The earliest span start of any open trace (windows must not close before it), or None."""
        while self._starts:
            start, trace_id = self._starts[0]
            trace = self._open.get(trace_id)
            if trace is not None and trace.first_ns == start:
                return start
            heapq.heappop(self._starts)
        return None

    def forget_source(self, tp: Hashable) -> None:
        """Drop a revoked partition's positions from open traces, so that a replay of it pins them again."""
        for trace in self._open.values():
            trace.sources = {s for s in trace.sources if s[0] != tp}

    def close_all(self) -> list[ClosedTrace]:
        return [self._close(tid, forced=False) for tid in list(self._open)]

    def _force_oldest(self) -> ClosedTrace:
        while True:
            _, trace_id = heapq.heappop(self._deadlines)
            if trace_id in self._open:
                self.counters["forced_closes"] += 1
                return self._close(trace_id, forced=True)

    def _close(self, trace_id: str, *, forced: bool) -> ClosedTrace:
        trace = self._open.pop(trace_id)
        self._closed_recently[trace_id] = None
        if len(self._closed_recently) > self._remember:
            self._closed_recently.popitem(last=False)
        self.counters["closed"] += 1
        return ClosedTrace(trace_id, tuple(trace.spans), frozenset(trace.sources), trace.late, forced)
