"""Which input offsets are still needed: the rule that makes committing safe, owned by the runtime.

A Kafka offset may be committed only when everything read before it has reached the graph and the sinks.
Spans wait in open traces and open windows for a while, so the messages that fed open state are *pinned* (of each
partition, a key pins the oldest message that fed it: the one the commit must wait for); the committable offset of a
partition is the oldest pinned offset, or the consumer position when none is pinned.
After a crash the daemon replays from there, and idempotent writes make the replay harmless.

Processors never see offsets: they keep state in named keyed stores (``processors.state``) and report which keys
input feeds (*retained*) and which keys no longer need it (*released*). :class:`PinTracker` knows which input is
being processed (a consumed record, or the input that fed a key whose content is being passed on: a closed trace
feeding a window *inherits* the trace's input) and maps keys to pinned offsets.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from processors.api.provenance import StateEvents

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


class PinTracker(StateEvents):
    """Offset pins from processor state; see the module docstring.

    A key holds, of each input partition that fed it, the *oldest* offset: the committable offset is the oldest
    pinned one, so a later record of the same partition feeding the key changes nothing (and costs one comparison:
    a trace fed by many messages, a window fed by many traces, holds one offset a partition, not one a message).

    Releases are collected, not applied: :meth:`take_released` hands them to the runtime, which releases them
    once the batch that released them is durable (graph written, messages acknowledged).
    """

    __slots__ = ("_current", "_held", "_one", "_released", "_released_sets", "pins")

    def __init__(self) -> None:
        self.pins = OffsetPins()
        # What each key holds: one source (most keys: fed by one partition) or the oldest offset of each partition.
        self._held: dict[tuple[str, Hashable], Source | dict[Hashable, int]] = {}
        self._released_sets: dict[tuple[str, Hashable], set[Source]] = {}  # this batch's, for inherit()
        self._released: list[Source] = []
        self._current: tuple[Source, ...] = ()
        self._one: Source | None = None  # the one source of ``_current``, when it has one only (the usual case)

    # ---- what is being processed ----------------------------------------------------------------------------

    def feeding(self, source: Source | None) -> None:
        """The record at ``source`` is being processed now (None: nothing, e.g. watermark work)."""
        self._current = (source,) if source is not None else ()
        self._one = source

    def inherit(self, store: str, key: Hashable) -> tuple[Source, ...]:
        """The content of ``key`` of ``store`` is being passed on: what it feeds holds the input it held (returned).
        A key released once in this batch (a closed trace, the usual case) held what it released."""
        name = (store, key)
        released = self._released_sets.get(name)
        if released is not None and len(released) == 1 and name not in self._held:
            current = self._current = tuple(released)
        else:
            current = self._current = tuple(self.held(store, key))
        self._one = current[0] if len(current) == 1 else None
        return current

    # ---- StateEvents -----------------------------------------------------------------------------------------

    def retained(self, store: str, key: Hashable) -> None:
        """The common case first, answered by one lookup and one comparison: a key fed by one record (a trace
        closing into its window: seven windowed processors retain theirs for each trace) already holding an older
        offset of that record's partition, as a window fed by many traces of one partition does."""
        one = self._one
        if one is not None:
            held = self._held.get((store, key))
            if type(held) is dict:
                old = held.get(one[0])
                if old is not None and old <= one[1]:
                    return
            elif held is not None and held[0] == one[0] and held[1] <= one[1]:
                return
        self._retain(store, key, self._current)

    def _retain(self, store: str, key: Hashable, current: tuple[Source, ...]) -> None:
        """``retained``, every case."""
        if not current:
            return
        name = (store, key)
        held = self._held.get(name)
        if held is None:
            if len(current) == 1:  # most keys are fed by one partition: no dict for them
                self._held[name] = current[0]
                self.pins.pin(current)
                return
            held = self._held[name] = {}
        elif not isinstance(held, dict):
            tp, offset = held
            if len(current) == 1 and current[0][0] == tp:
                if current[0][1] < offset:  # an older record of that partition (a replay): held from there on
                    self._held[name] = current[0]
                    self._move(tp, offset, current[0][1])
                return
            held = self._held[name] = {tp: offset}
        for tp, offset in current:
            old = held.get(tp)
            if old is None:
                held[tp] = offset
                self.pins.pin(((tp, offset),))
            elif offset < old:
                held[tp] = offset
                self._move(tp, old, offset)

    def _move(self, tp: Hashable, old: int, new: int) -> None:
        """A key held from ``old`` now holds from the older ``new``: releasing ``old`` at once is safe, since
        nothing of ``tp`` past ``new`` can be committed while ``new`` is pinned."""
        self.pins.pin(((tp, new),))
        self.pins.release(((tp, old),))

    def released(self, store: str, key: Hashable) -> None:
        held = self._held.pop((store, key), None)
        if held:
            sources = list(held.items()) if isinstance(held, dict) else [held]
            self._released.extend(sources)
            self._released_sets.setdefault((store, key), set()).update(sources)

    # ---- runtime -----------------------------------------------------------------------------------------------

    def take_released(self) -> list[Source]:
        """The pins released since the last call, to release once the current batch is durable."""
        out, self._released = self._released, []
        self._released_sets.clear()
        return out

    def release(self, sources: Iterable[Source]) -> None:
        self.pins.release(sources)

    def committable(self, tp: Hashable, position: int) -> int:
        return self.pins.committable(tp, position)

    def forget(self, tp: Hashable) -> None:
        """A revoked partition: its input is replayed by its next owner, so none of it stays pinned here."""
        for key, held in self._held.items():
            if isinstance(held, dict):
                held.pop(tp, None)
            elif held[0] == tp:
                self._held[key] = {}
        self._released = [s for s in self._released if s[0] != tp]
        self.pins.forget(tp)

    def held(self, store: str, key: Hashable) -> frozenset[Source]:
        """The input ``key`` of ``store`` holds (or held until released in this batch)."""
        held = self._held.get((store, key))
        sources = set() if held is None else set(held.items()) if isinstance(held, dict) else {held}
        return frozenset(sources | self._released_sets.get((store, key), set()))

    def total(self) -> int:
        return self.pins.total()

    def holding(self) -> int:
        """Keys that hold input (for tests and gauges)."""
        return len(self._held)
