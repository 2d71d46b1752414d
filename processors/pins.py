"""Which input offsets are still needed: the rule that makes committing safe.

A Kafka offset may be committed only when everything read before it has reached the graph and the sinks.
Spans wait in open traces and open windows for a while, so each message that fed open state is *pinned*; the
committable offset of a partition is the oldest pinned offset, or the consumer position when none is pinned.
After a crash the daemon replays from there, and idempotent writes make the replay harmless.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

Source = tuple[Hashable, int]  # (partition handle, offset)


class OffsetPins:
    """Reference counts of pinned offsets per partition, with the oldest one found in O(log n)."""

    __slots__ = ("_counts", "_heaps")

    def __init__(self) -> None:
        self._counts: dict[Hashable, dict[int, int]] = {}
        self._heaps: dict[Hashable, list[int]] = {}

    def pin(self, sources: Iterable[Source]) -> None:
        for tp, offset in sources:
            counts = self._counts.setdefault(tp, {})
            if offset not in counts:
                heapq.heappush(self._heaps.setdefault(tp, []), offset)
                counts[offset] = 0
            counts[offset] += 1

    def release(self, sources: Iterable[Source]) -> None:
        for tp, offset in sources:
            counts = self._counts.get(tp)
            if counts is None or offset not in counts:
                continue
            counts[offset] -= 1
            if counts[offset] <= 0:
                del counts[offset]

    def oldest(self, tp: Hashable) -> int | None:
        """The oldest offset of ``tp`` still pinned, or None."""
        heap = self._heaps.get(tp)
        counts = self._counts.get(tp, {})
        while heap and heap[0] not in counts:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def committable(self, tp: Hashable, position: int) -> int:
        """The offset to commit for ``tp`` given the consumer's ``position`` (next offset to read)."""
        oldest = self.oldest(tp)
        return position if oldest is None else min(oldest, position)

    def forget(self, tp: Hashable) -> None:
        """Drop every pin of a revoked partition (its new owner replays from the committed offset)."""
        self._counts.pop(tp, None)
        self._heaps.pop(tp, None)

    def pinned(self, tp: Hashable) -> int:
        return len(self._counts.get(tp, {}))

    def total(self) -> int:
        """Pinned offsets over every partition (the ``trace_repro_pinned_offsets`` gauge)."""
        return sum(len(counts) for counts in self._counts.values())
