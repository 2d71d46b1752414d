"""Per-partition event-time watermarks with idleness.

A partition's watermark is the largest event time it has delivered minus the allowed lateness. The stage's
watermark is the minimum over *active* partitions; a partition that delivered nothing for ``idle_ns`` of
wall-clock time stops holding the others back. When every partition is idle, event time is assumed to move
on with the wall clock (after the idle timeout) so that the last traces and windows still close when traffic
stops; that is the only use of the clock, which is injected.
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

    def forget(self, tp: Hashable) -> None:
        self._parts.pop(tp, None)

    def current(self) -> int:
        """The stage watermark in event-time nanoseconds (0 before any event)."""
        if not self._parts:
            return 0
        now = self._clock()
        active = [p for p in self._parts.values() if now - p.last_seen_wall_ns < self.idle_ns]
        if active:
            return min(p.max_event_ns for p in active) - self.lateness_ns
        newest = max(self._parts.values(), key=lambda p: p.max_event_ns)
        idle_for = now - max(p.last_seen_wall_ns for p in self._parts.values()) - self.idle_ns
        return newest.max_event_ns - self.lateness_ns + max(idle_for, 0)
