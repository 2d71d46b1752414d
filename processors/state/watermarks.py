"""Event-time watermarks: per-partition with idleness (a stage's own input), and upstream (the stage before it).

:class:`Watermarks`: a partition's watermark is the largest event time it has delivered minus the allowed
lateness; the stage's watermark is the minimum over *active* partitions (a partition that delivered nothing for
``idle_ns`` of wall time stops holding the others back). When every partition has been idle for ``idle_ns``,
event time catches up with the wall clock from the newest event seen: ``newest + (now - last input)``. Idle time,
lateness and the trace gap do not stack: an isolated trace closes one trace gap after its last span arrived, not
``idle + lateness + gap`` later. (When input resumes the watermark is again the active partitions' minimum; what
was closed during the catch-up stays closed and later spans of it are late, counted and reassembled.)

:class:`UpstreamWatermarks`: a downstream stage's event time is the minimum of the low watermarks its upstream
stages published for each of *their* input partitions (``otlp_spans/3``), so that it never runs ahead of what
upstream has finished; entries not refreshed for ``expiry_ns`` of wall time (an input partition nobody owns any
more) stop holding it back. It never moves backwards either, and with no upstream at all it does not move.

The clock is injected; the wall clock is used only for idleness and expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Partition:
    max_event_ns: int = 0
    last_seen_wall_ns: int = 0


class Watermarks:
    __slots__ = ("_clock", "_parts", "idle_ns", "late_events", "lateness_ns")

    def __init__(self, lateness_ns: int, idle_ns: int, clock: Callable[[], int]) -> None:
        self.lateness_ns = lateness_ns
        self.idle_ns = idle_ns
        self._clock = clock
        self._parts: dict[Hashable, _Partition] = {}
        self.late_events = 0

    def observe(self, tp: Hashable, event_ns: int) -> bool:
        """Record an event time from ``tp``; returns True when it is late (behind the current watermark)."""
        late = event_ns < self.current()
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition()
        part.last_seen_wall_ns = self._clock()
        if event_ns > part.max_event_ns:
            part.max_event_ns = event_ns
        if late:
            self.late_events += 1
        return late

    def assign(self, tp: Hashable) -> None:
        """A partition newly owned (a start, a rebalance): until it delivers (or stays idle for ``idle_ns``) it
        holds the watermark back, so that what it replays is not judged against the others' progress: its traces
        assemble whole instead of closing span by span as late."""
        if tp not in self._parts:
            self._parts[tp] = _Partition(0, self._clock())

    def forget(self, tp: Hashable) -> None:
        self._parts.pop(tp, None)

    def current(self) -> int:
        """The stage watermark in event-time nanoseconds (0 before any event; it moves back when a newly assigned
        partition starts behind the others)."""
        if not self._parts:
            return 0
        now = self._clock()
        active = [p for p in self._parts.values() if now - p.last_seen_wall_ns < self.idle_ns]
        if active:
            return max(0, min(p.max_event_ns for p in active) - self.lateness_ns)
        newest = max(p.max_event_ns for p in self._parts.values())
        return newest + now - max(p.last_seen_wall_ns for p in self._parts.values())


@dataclass(slots=True)
class _Upstream:
    watermark_ns: int
    updated_wall_ns: int


class UpstreamWatermarks:
    """The minimum of the upstream low watermarks per upstream input partition; see the module docstring."""

    __slots__ = ("_clock", "_floor", "_sources", "expiry_ns")

    def __init__(self, expiry_ns: int, clock: Callable[[], int]) -> None:
        self.expiry_ns = expiry_ns
        self._clock = clock
        self._sources: dict[str, _Upstream] = {}
        self._floor = 0

    def __len__(self) -> int:
        return len(self._sources)

    def update(self, source: str, watermark_ns: int) -> None:
        """Upstream says: everything of input partition ``source`` up to ``watermark_ns`` has been emitted."""
        entry = self._sources.get(source)
        now = self._clock()
        if entry is None:
            self._sources[source] = _Upstream(watermark_ns, now)
        else:
            entry.watermark_ns = max(entry.watermark_ns, watermark_ns)
            entry.updated_wall_ns = now

    def current(self) -> int:
        now = self._clock()
        live = [u.watermark_ns for u in self._sources.values() if now - u.updated_wall_ns < self.expiry_ns]
        if live:
            self._floor = max(self._floor, min(live))
        return self._floor
