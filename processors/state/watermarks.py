"""Event-time watermarks: per-partition with idleness (a stage's own input), and upstream (the stage before it).

:class:`Watermarks`: a partition's watermark is the largest event time it has delivered minus the allowed lateness;
the stage's watermark is the minimum over *active* partitions. A partition is idle (stops holding the others back)
when it delivered nothing for ``idle_ns`` of wall time *and* the consumer has read it to its end: silence alone is
not idleness, since a partition that is silent because its backlog waits behind another partition's, or because a
rebalance or a broker outage stopped the fetches, has events to come that are older than the others'. The runtime
says which partitions are caught up (:meth:`Watermarks.progress`: position at the high-water mark, from a fresh
fetch response); until it first does, silence is enough (transport-free use). When every partition has been idle for
``idle_ns``, event time catches up with the wall clock from the newest event seen: ``newest + (now - last input)``.
Idle time, lateness and the trace gap do not stack: an isolated trace closes one trace gap after its last span
arrived, not ``idle + lateness + gap`` later. (When input resumes the watermark is again the active partitions'
minimum; what was closed during the catch-up stays closed and later spans of it are late, counted and reassembled.)

:class:`UpstreamWatermarks`: a downstream stage's event time is the minimum of the low watermarks its upstream
stages published for each of *their* input partitions (``otlp_spans/3``), so that it never runs ahead of what
upstream has finished; entries not refreshed for ``expiry_ns`` of wall time (an input partition nobody owns any
more) stop holding it back. It never moves backwards either, and with no upstream at all it does not move.

The clock is injected; the wall clock is used only for idleness and expiry.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass


@dataclass(slots=True)
class _Partition:
    max_event_ns: int = 0
    last_seen_wall_ns: int = 0


class Watermarks:
    __slots__ = ("_caught_up", "_clock", "_parts", "idle_ns", "late_events", "lateness_ns")

    def __init__(self, lateness_ns: int, idle_ns: int, clock: Callable[[], int]) -> None:
        self.lateness_ns = lateness_ns
        self.idle_ns = idle_ns
        self._clock = clock
        self._parts: dict[Hashable, _Partition] = {}
        self._caught_up: frozenset[Hashable] | None = None  # None until the runtime reports: silence is enough
        self.late_events = 0

    def progress(self, caught_up: Collection[Hashable]) -> None:
        """The partitions read to their end, as of now (the others are not idle however long they are silent)."""
        self._caught_up = frozenset(caught_up)

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

    def owns(self, tp: Hashable) -> bool:
        return tp in self._parts

    def seen(self) -> bool:
        """Whether some partition has delivered an event."""
        return any(p.max_event_ns for p in self._parts.values())

    def holding(self) -> bool:
        """Whether some partition is active (not idle): else this input has nothing more to come for now."""
        return bool(self._active(self._clock()))

    def _active(self, now: int) -> list[_Partition]:
        silent_ok = self._caught_up if self._caught_up is not None else self._parts.keys()  # None: silence is enough
        return [p for tp, p in self._parts.items() if now - p.last_seen_wall_ns < self.idle_ns or tp not in silent_ok]

    def current(self) -> int:
        """The stage watermark in event-time nanoseconds (0 before any event; it moves back when a newly assigned
        partition starts behind the others)."""
        if not self._parts:
            return 0
        now = self._clock()
        active = self._active(now)
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
