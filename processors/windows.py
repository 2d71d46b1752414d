"""Per-window service call aggregates (the graph's ``CALLS`` edges), closed on the watermark.

A closed trace contributes to the window its root starts in: one call per span whose parent belongs to another
service (and per DB client span, a call to the database system). A window closes once the watermark is past
its end plus the trace gap, so every trace that started inside it has closed too. A trace arriving for a
window already closed is counted as late and left out of the aggregate (never a partial overwrite).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from processors.sketch import LatencySketch
from processors.traces import ClosedTrace
from streamer.events import SpanKind


@dataclass(slots=True)
class CallStats:
    count: int = 0
    errors: int = 0
    latency: LatencySketch = field(default_factory=LatencySketch)


@dataclass(slots=True)
class _Window:
    start_ns: int
    calls: dict[tuple[str, str], CallStats] = field(default_factory=dict)
    sources: set[tuple[Hashable, int]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    window_id: str  # "<start ms>-<end ms>", stable across replays
    start_ns: int
    end_ns: int
    calls: dict[tuple[str, str], CallStats]
    sources: frozenset[tuple[Hashable, int]]


class _HasSources(Protocol):
    sources: set[tuple[Hashable, int]]


def ready_windows(starts: Iterable[int], watermark_ns: int, size_ns: int, grace_ns: int,
                  open_since_ns: int | None) -> list[int]:  # fmt: skip
    """Starts of the windows that may close, in order: past ``end + grace`` on the watermark, and not reachable by
    a trace still open since ``open_since_ns``. Shared by every windowed aggregate of stage 1."""
    limit = watermark_ns - size_ns - grace_ns
    if open_since_ns is not None:
        limit = min(limit, open_since_ns - size_ns)
    return sorted(s for s in starts if s <= limit)


def forget_partition(windows: Iterable[_HasSources], tp: Hashable) -> None:
    """Drop a revoked partition's positions, so that its replay pins them again."""
    for window in windows:
        window.sources = {s for s in window.sources if s[0] != tp}


class CallWindows:
    __slots__ = ("_closed_before", "_windows", "counters", "grace_ns", "size_ns")

    def __init__(self, size_ns: int, grace_ns: int) -> None:
        self.size_ns = size_ns
        self.grace_ns = grace_ns
        self._windows: dict[int, _Window] = {}
        self._closed_before = 0  # windows starting before this have been emitted
        self.counters = {"late_traces": 0, "windows_closed": 0}

    def __len__(self) -> int:
        return len(self._windows)

    def add(self, trace: ClosedTrace) -> set[tuple[Hashable, int]] | None:
        """Count the trace's calls in its window and return the input sources new to that window.

        Returns None (and counts a late trace) when the window has already closed.
        """
        root_start = trace.root.start_ns  # the root's window, even when a child's clock runs early
        start = root_start - root_start % self.size_ns
        if start < self._closed_before:
            self.counters["late_traces"] += 1
            return None
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = _Window(start)
        new_sources = trace.sources - window.sources
        window.sources.update(new_sources)
        by_id = {s.span_id: s for s in trace.spans}
        for span in trace.spans:
            parent = by_id.get(span.parent_id)
            callee = span.resource.service
            if parent is not None and parent.resource.service != callee:
                self._count(window, parent.resource.service, callee, span.duration_ms, span.is_error)
            if span.db is not None and span.kind == SpanKind.CLIENT:
                self._count(window, callee, span.db.system or "db", span.duration_ms, span.is_error)
        return set(new_sources)

    @staticmethod
    def _count(window: _Window, caller: str, callee: str, ms: float, error: bool) -> None:
        stats = window.calls.get((caller, callee))
        if stats is None:
            stats = window.calls[(caller, callee)] = CallStats()
        stats.count += 1
        stats.errors += error
        stats.latency.add(ms)

    def close_until(self, watermark_ns: int, open_since_ns: int | None = None) -> list[ClosedWindow]:
        """Close windows past ``end + grace``, but none that a still-open trace (started at ``open_since_ns``)
        may yet contribute to."""
        ready = ready_windows(self._windows, watermark_ns, self.size_ns, self.grace_ns, open_since_ns)
        if ready:
            self._closed_before = max(self._closed_before, ready[-1] + self.size_ns)
        return [self._emit(s) for s in ready]

    def forget_source(self, tp: Hashable) -> None:
        forget_partition(self._windows.values(), tp)

    def _emit(self, start: int) -> ClosedWindow:
        w = self._windows.pop(start)
        self.counters["windows_closed"] += 1
        end = start + self.size_ns
        wid = f"{start // 1_000_000}-{end // 1_000_000}"
        return ClosedWindow(wid, start, end, w.calls, frozenset(w.sources))
