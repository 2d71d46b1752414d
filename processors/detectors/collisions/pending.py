"""An entity's input not judged yet: the detector's keys for it, each with the event time it is held to.

When the entity is due, what the watermark has passed is released and the oldest time still held says when it is due
again. A table's scope (``table:*``) holds a key per trace that touched the table within a window or two, and a busy
one is due at nearly every watermark: a walk of every key each time cost the entities stage in proportion to batches
times held traces. The keys are also kept in a heap by time, so a release pops only what it releases. A key held to a
later time (a trace's later statement on the row) leaves its earlier entry behind; left entries are skipped when they
come up, and the heap is rebuilt from the keys when they outnumber them (so it stays within twice the keys).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

Slot = tuple[str, str]  # (entity, trace id or "@lsn")


class PendingInputs:
    """The keys held, with their times; see the module docstring."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[Slot, int] = {}
        self._heap: list[tuple[int, Slot]] = []  # (time, key): one entry per key at its time, and entries left behind

    def __len__(self) -> int:
        return len(self._at)

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._at))

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def hold(self, key: Slot, at: int) -> None:
        """``key`` is held to ``at`` (its time so far, or a later one)."""
        if self._at.get(key) == at:
            return
        self._at[key] = at
        heap = self._heap
        heapq.heappush(heap, (at, key))
        if len(heap) > 2 * len(self._at) + 64:  # entries left behind outnumber the keys: rebuilt
            self._heap = [(t, k) for k, t in self._at.items()]
            heapq.heapify(self._heap)

    def discard(self, key: Slot) -> None:
        self._at.pop(key, None)

    def release_until(self, until_ns: int) -> list[Slot]:
        """The keys held to ``until_ns`` or before, no longer held."""
        heap, at = self._heap, self._at
        released = []
        while heap and heap[0][0] <= until_ns:
            t, key = heapq.heappop(heap)
            if at.get(key) == t:  # (else an entry left behind: the key went, or is held later)
                del at[key]
                released.append(key)
        return released

    def oldest(self) -> int | None:
        """The earliest time a key is held to; None when none is."""
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
