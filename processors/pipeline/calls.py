"""Per-window service call aggregates (the graph's ``CALLS`` edges), closed on the watermark.

A closed trace contributes to the window its root starts in: one call per span whose parent belongs to another
service (and per DB client span, a call to the database system). Windows are the shared tumbling-window helper
(closing once the watermark is past end + trace gap, never while an open trace can still reach them); a trace for
a window already closed is counted late (``calls_late``) and left out of the aggregate.

Each window keeps one contribution per input partition (``ClosedTrace.part``): a partition's contribution to a
window is the same whoever owns the partition and however often it is replayed, so the graph stores contributions
under their partition (idempotent) and sums them (additive): N replicas write what one process would. When a
partition is revoked, its contributions to open windows are dropped (its new owner replays them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.lib.sketch import LatencySketch
from processors.model.events import SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.state.windows import ClosedWindow, TumblingWindows


@dataclass(slots=True)
class CallStats:
    count: int = 0
    errors: int = 0
    latency: LatencySketch = field(default_factory=LatencySketch)


_CLIENT = SpanKind.CLIENT
_ERROR = StatusCode.ERROR
Calls = dict[tuple[str, str], CallStats]  # (caller, callee) -> stats
Parts = dict[str, Calls]  # input partition -> its calls in the window


class CallWindows:
    """CALLS aggregates per tumbling window; see the module docstring."""

    __slots__ = ("_windows",)

    def __init__(self, size_ns: int, grace_ns: int, *, max_windows: int = 1_000, telemetry: Telemetry | None = None,
                 events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self._windows: TumblingWindows[Parts] = TumblingWindows(
            "calls", size_ns, grace_ns, lambda _start: {}, max_windows=max_windows, telemetry=telemetry, events=events
        )

    def __len__(self) -> int:
        return len(self._windows)

    def add(self, trace: ClosedTrace) -> bool:
        """Count the trace's calls in its root's window; False (counted late) when that window has closed."""
        parts = self._windows.at(trace.root.start_ns)  # the root's window, even when a child's clock runs early
        if parts is None:
            return False
        calls = parts.setdefault(trace.part, {})
        facts = trace.facts
        by_id = facts.by_id
        for span in trace.spans:
            parent = by_id.get(span.parent_id)
            if parent is not None and parent.resource is not span.resource:  # (one resource: one service)
                caller, callee = parent.resource.service, span.resource.service
                if caller != callee:
                    _count(calls, caller, callee, span)
        # (The DB spans the facts list already, not a look at every span's detail: a window's sums and sketches are
        # the same in any order of its calls.)
        for span in facts.db:
            db = span.db
            if db is not None and span.kind == _CLIENT:
                _count(calls, span.resource.service, db.system or "db", span)
        return True

    def close_until(self, watermark_ns: int, open_since_ns: int | None = None) -> list[ClosedWindow[Parts]]:
        return self._windows.close_until(watermark_ns, open_since_ns)

    def forget_part(self, part: str) -> None:
        """A revoked input partition: its contributions to open windows go (its next owner replays them)."""
        self._windows.each(lambda parts: parts.pop(part, None))


def _count(calls: Calls, caller: str, callee: str, span: Span) -> None:
    """One call of ``span``'s, from ``caller`` to ``callee``."""
    stats = calls.get((caller, callee))
    if stats is None:
        stats = calls[(caller, callee)] = CallStats()
    stats.count += 1
    stats.errors += span.status == _ERROR
    stats.latency.add(span.duration_ms)
