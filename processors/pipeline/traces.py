"""Trace assembly in event time: spans gather per trace until the trace has been quiet for ``gap``.

Closing is driven by the watermark (``close_until``), never by the wall clock. State is bounded: at most
``max_open`` traces (the least recently fed one is closed early, counted as ``max_open_traces``), ``max_spans``
spans per trace (the excess is dropped, counted as ``max_spans_per_trace``) and ``max_bytes`` of spans in all. A
span's size is approximated when it is added (a fixed cost and its share of its message's wire size, or
``span_bytes``: a span with a megabyte statement counts a megabyte); past the bound the least recently fed traces
are closed early, as at ``max_open``, counted as ``max_open_trace_bytes`` (a trace alone over it is closed with the
spans that took it there). A span for a trace closed recently is *late*: it is counted and assembled again (its
writes are idempotent). Open traces live in a keyed store (``traces``), so the runtime knows which input messages
still feed open traces.

A request can run longer than ``gap``: a handler's children are exported when they end, its own span when the
request ends (a 30 s hang exports its children 30 s before its root). So a trace with an *open parent* (a span
whose parent has not arrived, where that parent is in the same process: the span is not a SERVER or CONSUMER span,
whose parent is a remote caller that may never report) stays open until that parent arrives, up to
``max_request`` after the trace's first start; closing it there is counted (``max_request_duration``) and a root
that comes later still is a late span, as before. A trace that lost spans (to ``max_spans``, or dropped before
assembly: :meth:`TraceAssembler.lost`) awaits no parent: it may have been one of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.model.events import SpanKind
from processors.model.sizes import SPAN_OVERHEAD_BYTES, span_bytes
from processors.model.span import Span, share_trace_id
from processors.model.trace import ClosedTrace
from processors.state.keyed import Deadlines, KeyedState
from processors.state.lru import CountedLRU

_REMOTE_PARENT = (SpanKind.SERVER, SpanKind.CONSUMER)  # their parent is a caller's span, in another process
SPREAD_SPANS = 20_000  # spans closed by one ``closing(spread=True)`` beyond those added since the last one


@dataclass(slots=True)
class _OpenTrace:
    # By span id, in arrival order: a redelivered message must not double the trace (one dict, not a list and a set
    # of the ids: a third of their size, for every span held open).
    spans: dict[str, Span] = field(default_factory=dict)
    last_ns: int = 0
    first_ns: int = 0
    late: bool = False
    awaited: set[str] | None = None  # in-process parents not arrived yet (their spans are running); None when none
    truncated: bool = False  # spans were dropped at max_spans: a parent may be among them, none is awaited
    trace_id: str = ""  # its first span's: the one string its spans share (``share_trace_id``)


class TraceAssembler:
    """Open traces keyed by trace id; see the module docstring."""

    __slots__ = (
        "_added", "_closed_recently", "_deadlines", "_forced", "_lossy", "_open", "_starts", "gap_ns",
        "max_request_ns", "max_spans", "telemetry",
    )  # fmt: skip

    def __init__(
        self,
        gap_ns: int,
        max_open: int,
        max_spans: int,
        remember_closed: int = 100_000,
        *,
        max_bytes: int | None = None,
        max_request_ns: int | None = None,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.gap_ns = gap_ns
        self.max_request_ns = gap_ns if max_request_ns is None else max(gap_ns, max_request_ns)
        self.max_spans = max_spans
        self.telemetry = (telemetry or Telemetry("traces")).declare(
            "max_spans_per_trace", "max_open_traces", "max_request_duration"
        )
        self._open: KeyedState[str, _OpenTrace] = KeyedState(
            "traces", bound=max_open, new=lambda _tid: _OpenTrace(), telemetry=self.telemetry, events=events,
            on_evict=self._evicted, reason="max_open_traces", max_bytes=max_bytes, bytes_reason="max_open_trace_bytes",
        )  # fmt: skip
        self._deadlines: Deadlines[str] = Deadlines()  # last span end + gap
        self._starts: list[tuple[int, str]] = []  # (first span start, trace_id), lazily invalidated
        self._closed_recently: CountedLRU[str, None] = CountedLRU(remember_closed)
        self._lossy: CountedLRU[str, None] = CountedLRU(remember_closed)  # traces that lost spans before assembly
        self._forced: list[ClosedTrace] = []
        self._added = 0  # spans added since the last spread close

    def __len__(self) -> int:
        return len(self._open)

    @property
    def bytes(self) -> int:
        """The approximate size of the open traces' spans (counted only with a ``max_bytes`` bound)."""
        return self._open.bytes

    def add(self, spans: Iterable[Span], wire_bytes: int | None = None) -> list[ClosedTrace]:
        """Add one message's spans, or a run of one partition's messages' (the input being processed feeds their
        traces); ``wire_bytes``, their size on the wire, sizes them for ``max_bytes`` (each span a fixed cost and
        its share of the bytes: one ``len`` per message), else each span is sized by ``span_bytes``.

        Returns the traces closed early by the ``max_open`` or ``max_bytes`` bound to make room.
        """
        count = self.telemetry.count
        sized = self._open.max_bytes is not None
        share: int | None = None
        if sized and wire_bytes is not None:
            spans = spans if isinstance(spans, Sequence) else list(spans)
            share = SPAN_OVERHEAD_BYTES + wire_bytes // max(1, len(spans))
        grown: dict[str, int] = {}  # bytes added to each trace by this message
        # Traces this message already feeds: retained once per message, not once per span (in the order they came:
        # their deadlines are set in it, so that traces due at the same time close in it).
        fed: dict[str, None] = {}
        # Traces opened or started earlier by this message: their start goes on the heap once, after it (spans
        # come children first, each parent starting earlier: a push each was several for every trace).
        started: set[str] = set()
        added = 0
        get = self._open.getter
        for span in spans:
            tid = span.trace_id
            trace = get(tid)
            if trace is None:
                trace = self._open.retain(tid)
                fed[tid] = None
                trace.first_ns, trace.last_ns, trace.trace_id = span.start_ns, span.end_ns, tid
                started.add(tid)
                trace.truncated = tid in self._lossy
                if tid in self._closed_recently:
                    trace.late = True
                    count("late_spans")
            if span.span_id in trace.spans:
                count("duplicate_spans")
                if tid not in fed:  # a replayed message still feeds this open trace: pin it too
                    self._open.retain(tid)
                    fed[tid] = None
                continue
            if len(trace.spans) >= self.max_spans:
                self.telemetry.drop("max_spans_per_trace")
                if trace.awaited:  # the awaited parent may be this span or a later dropped one: wait no more
                    trace.awaited = None
                    self._deadlines.set(tid, self._deadline(trace))
                trace.truncated = True
                continue
            if tid not in fed:  # this message feeds the trace (an evicted one came back through the branch above)
                self._open.retain(tid)
                fed[tid] = None
            trace.spans[span.span_id] = span
            if tid is not trace.trace_id:  # the trace came in several messages: one copy of its id for its spans
                share_trace_id(span, trace.trace_id)
            if span.start_ns < trace.first_ns:
                trace.first_ns = span.start_ns
                started.add(tid)
            added += 1
            if not trace.truncated:
                awaited = trace.awaited
                if awaited is not None:
                    awaited.discard(span.span_id)
                if span.parent_id and span.kind not in _REMOTE_PARENT and span.parent_id not in trace.spans:
                    if awaited is None:
                        awaited = trace.awaited = set()
                    awaited.add(span.parent_id)
                elif awaited is not None and not awaited:
                    trace.awaited = None  # an empty set keeps its table
            if span.end_ns > trace.last_ns:
                trace.last_ns = span.end_ns
            if sized:
                grown[tid] = grown.get(tid, 0) + (share if share is not None else span_bytes(span))
        count("spans", added)
        self._added += added
        # Each trace fed gets its deadline once, after the message (every open trace has one, even when its first
        # span has no end time); a trace the bounds closed meanwhile is not there, or is a new one: its own then.
        set_deadline, deadline = self._deadlines.set, self._deadline
        for tid in fed:
            trace = get(tid)
            if trace is not None:
                set_deadline(tid, deadline(trace))
        for tid in started:
            trace = get(tid)
            if trace is not None:
                heapq.heappush(self._starts, (trace.first_ns, tid))
        if sized:  # after the message: the byte bound may close a trace it fed, with the spans that took it there
            for tid, size in grown.items():
                if tid in self._open:
                    self._open.charge(tid, size)
            self.telemetry.gauge("open_trace_bytes", self._open.bytes)
        forced, self._forced = self._forced, []
        return forced

    def lost(self, trace_ids: Iterable[str]) -> None:
        """Spans of these traces were dropped before assembly (unreadable, absurd times): a parent they await may
        be among them, so they (open now or later) close after the gap, not at ``max_request``."""
        for tid in trace_ids:
            self._lossy.add(tid)
            trace = self._open.get(tid)
            if trace is not None and not trace.truncated:
                trace.truncated = True
                trace.awaited = None
                self._deadlines.set(tid, self._deadline(trace))

    def _deadline(self, trace: _OpenTrace) -> int:
        """Quiet for ``gap`` after its last span's end, or while a parent is awaited, ``max_request`` after its start
        (never before the quiet deadline)."""
        quiet = trace.last_ns + self.gap_ns
        if not trace.awaited or trace.late:  # a late trace's parent may be in the trace that closed already
            return quiet
        return max(quiet, trace.first_ns + self.max_request_ns)

    def close_until(self, watermark_ns: int) -> list[ClosedTrace]:
        """Close every trace whose last span ended more than ``gap`` before the watermark (or, awaiting a parent,
        that started more than ``max_request`` before it: counted as ``max_request_duration``)."""
        return list(self.closing(watermark_ns))

    def closing(self, watermark_ns: int, *, spread: bool = False) -> Iterator[ClosedTrace]:
        """``close_until``, one trace at a time: each closes as the caller takes it, so that what the caller makes
        of the traces taken so far replaces them, rather than all of a burst's spans and all their output at once.

        With ``spread``, it stops once the traces closed hold the spans added since the last such call and
        ``SPREAD_SPANS`` more (at least one trace): the rest stay open and due, for the next batch. A burst held
        open by the gap then closes over several batches, each one's output written before the next is made, while
        closing keeps up with any rate of input."""
        budget = None
        if spread:
            budget, self._added = self._added + SPREAD_SPANS, 0
        discard, closed_trace = self._open.discard, self._closed
        for tid in self._deadlines.pop_due(watermark_ns):  # (its deadline popped: nothing to cancel)
            trace = discard(tid)
            if trace is None:
                continue
            if trace.awaited and not trace.late:
                self.telemetry.drop("max_request_duration")  # closed before its parent came, as at max_open
            closed = closed_trace(tid, trace, forced=False)
            yield closed
            if budget is not None:
                budget -= len(closed.spans)
                if budget <= 0:
                    return

    def oldest_start(self) -> int | None:
        """The earliest span start of any open trace (windows must not close before it), or None. (Every closed
        trace's entries are popped here, after each batch: a loop of locals.)"""
        starts, get, pop = self._starts, self._open.getter, heapq.heappop
        while starts:
            start, tid = starts[0]
            trace = get(tid)
            if trace is not None and trace.first_ns == start:
                return start
            pop(starts)
        return None

    def discard(self, tid: str) -> bool:
        """Drop an open trace without closing it (its partition went to another instance, which replays it)."""
        trace = self._open.discard(tid)
        if trace is None:
            return False
        self._deadlines.cancel(tid)
        self.telemetry.count("revoked")
        return True

    def open_ids(self) -> list[str]:
        return list(self._open)

    def close_all(self) -> list[ClosedTrace]:
        return [self._close(tid, forced=False) for tid in list(self._open)]

    def _evicted(self, tid: str, trace: _OpenTrace) -> None:
        """The open-trace bound evicted ``tid`` (counted as ``max_open_traces``): close it early, not lose it."""
        self._deadlines.cancel(tid)
        self._forced.append(self._closed(tid, trace, forced=True))

    def _close(self, tid: str, *, forced: bool) -> ClosedTrace:
        trace = self._open.discard(tid)
        assert trace is not None
        self._deadlines.cancel(tid)
        return self._closed(tid, trace, forced=forced)

    def _closed(self, tid: str, trace: _OpenTrace, *, forced: bool) -> ClosedTrace:
        """The closed trace of ``trace``, no longer open (its deadline gone too)."""
        self._closed_recently.add(tid)
        self.telemetry.count("closed")
        return ClosedTrace(tid, tuple(trace.spans.values()), trace.late, forced)
