"""Per-key processor state with a counted bound, and event-time deadlines per key.

:class:`KeyedState` is the one way a processor keeps state about keys (a trace id, an entity, a window start):
``retain`` when input feeds a key, ``release`` when the key's input is no longer needed (state kept, e.g. an
entity judged but remembered), ``discard`` when the key goes. The runtime hears of each through
:class:`~processors.api.provenance.StateEvents` and turns them into offset pins; processors never see offsets.
At ``bound`` keys, retaining a new one evicts the least recently retained (counted as a drop, ``reason`` naming
the bound), after ``on_evict`` has seen it (a trace assembler closes the evicted trace early instead of losing it).

Where what a key holds varies in size, ``max_bytes`` bounds the sum of the sizes its owner reports (``put`` with a
size, ``charge`` as a key grows: an approximation such as a record's wire size, never a walk of the objects): past
it, the least recently retained keys are evicted the same way, counted as ``bytes_reason``, until the sum is back
under the bound (a key alone over it goes too).
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class KeyedState(Generic[K, V]):
    """Named per-key state; see the module docstring."""

    __slots__ = ("_data", "_sizes", "bound", "bytes", "bytes_reason", "events", "max_bytes", "name", "new",
                 "on_evict", "reason", "telemetry")  # fmt: skip

    def __init__(
        self,
        name: str,
        *,
        bound: int,
        new: Callable[[K], V],
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
        on_evict: Callable[[K, V], None] | None = None,
        reason: str = "",
        max_bytes: int | None = None,
        bytes_reason: str = "",
    ) -> None:
        if bound < 1:
            raise ValueError(f"{name}: bound must be >= 1, got {bound}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"{name}: max_bytes must be >= 1, got {max_bytes}")
        self.name = name
        self.bound = bound
        self.new = new
        self.reason = reason or name + "_bound"  # the drop reason counted when the bound evicts a key
        self.max_bytes = max_bytes
        self.bytes_reason = bytes_reason or name + "_bytes"  # ... and when the byte bound does
        self.telemetry = (telemetry or Telemetry(name)).declare(self.reason)
        if max_bytes is not None:
            self.telemetry.declare(self.bytes_reason)
        self.events = events
        self.on_evict = on_evict
        self._data: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}  # the sizes reported for keys (absent: 0)
        self.bytes = 0  # their sum

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._data))

    def get(self, key: K) -> V | None:
        """The state of ``key`` without retaining anything."""
        return self._data.get(key)

    @property
    def getter(self) -> Callable[[K], V | None]:
        """``get`` as the mapping's own C-level method (for a loop over every span; it stays valid)."""
        return self._data.get

    def items(self) -> list[tuple[K, V]]:
        return list(self._data.items())

    def retain(self, key: K) -> V:
        """The state of ``key`` (created if new), now holding the input being processed."""
        data = self._data
        value = data.get(key)
        if value is None:
            if len(data) >= self.bound:
                self._evict()
            value = data[key] = self.new(key)
        else:
            data.move_to_end(key)
        self.events.retained(self.name, key)
        return value

    def put(self, key: K, value: V, size: int = 0) -> None:
        """Retain ``key`` with ``value`` as its state (replacing any, and its size), holding the input being
        processed; ``size`` counts against ``max_bytes``."""
        data = self._data
        if key not in data and len(data) >= self.bound:
            self._evict()
        data[key] = value
        data.move_to_end(key)
        self.events.retained(self.name, key)
        if size or key in self._sizes:
            self.bytes += size - self._sizes.pop(key, 0)
            if size:
                self._sizes[key] = size
            self._shed()

    def charge(self, key: K, size: int) -> None:
        """``key``'s state grew by ``size`` (it must be held); past ``max_bytes``, keys are evicted."""
        if key not in self._data:
            raise KeyError(f"{self.name}: charged {key!r}, which is not held")
        sizes = self._sizes
        sizes[key] = sizes.get(key, 0) + size
        self.bytes += size
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            self._shed()

    def release(self, key: K) -> None:
        """The input that fed ``key`` so far is no longer needed; its state stays."""
        if key in self._data:
            self.events.released(self.name, key)

    def discard(self, key: K) -> V | None:
        """Drop ``key`` and release its input."""
        value = self._data.pop(key, None)
        if value is not None:
            self.bytes -= self._sizes.pop(key, 0)
            self.events.released(self.name, key)
        return value

    def _shed(self) -> None:
        """Evict the least recently retained keys while the sizes are over ``max_bytes``."""
        while self.max_bytes is not None and self.bytes > self.max_bytes and self._data:
            self._evict(self.bytes_reason)

    def _evict(self, reason: str = "") -> None:
        key, value = self._data.popitem(last=False)
        self.bytes -= self._sizes.pop(key, 0)
        self.telemetry.drop(reason or self.reason)
        if self.on_evict is not None:
            self.on_evict(key, value)
        self.events.released(self.name, key)


class Deadlines(Generic[K]):
    """One event-time deadline per key, the earliest found in O(log n); rescheduling invalidates lazily.

    Each key has one entry in the heap that counts (``_queued``: its time, never after the key's deadline): a
    deadline moved later is only noted, and one moved earlier is pushed only when it is before that entry (an open
    trace's deadline goes later while it awaits a parent and back when the parent comes, at every such span). When
    the entry comes up before the deadline, it moves on to it. Entries left behind (by a push before them, or a
    cancel) are skipped when they come up."""

    __slots__ = ("_at", "_heap", "_queued", "_seq")

    def __init__(self) -> None:
        self._at: dict[K, int] = {}
        self._queued: dict[K, int] = {}  # the time of each key's entry in the heap that counts
        self._heap: list[tuple[int, int, K]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, key: object) -> bool:
        return key in self._at

    def at(self, key: K) -> int | None:
        return self._at.get(key)

    def set(self, key: K, at: int) -> None:
        """The deadline of ``key`` is now ``at`` (earlier or later than before). Pushed only when before the key's
        entry in the heap, which otherwise moves on to it when it comes up (an open trace's deadline moves with
        each of its spans: one entry per span stayed in the heap until the trace closed)."""
        self._at[key] = at
        queued = self._queued.get(key)
        if queued is None or at < queued:
            self._queued[key] = at
            heapq.heappush(self._heap, (at, next(self._seq), key))

    def extend(self, key: K, at: int) -> None:
        """Move the deadline of ``key`` to ``at`` if that is later (or set it if there is none)."""
        current = self._at.get(key)
        if current is None or at > current:
            self.set(key, at)

    def cancel(self, key: K) -> None:
        if self._at.pop(key, None) is not None:
            del self._queued[key]

    def _top(self) -> bool:
        """Whether the heap's first entry counts and is due at its key's deadline; an entry left behind is
        dropped, one before its key's deadline moves on to it (then False, the caller looks again)."""
        when, _, key = self._heap[0]
        if self._queued.get(key) != when:  # left behind (a later push, a cancel, or the key's deadline passed)
            heapq.heappop(self._heap)
            return False
        due = self._at[key]
        if due == when:
            return True
        self._queued[key] = due
        heapq.heapreplace(self._heap, (due, next(self._seq), key))
        return False

    def due(self, now: int) -> list[K]:
        """Pop every key whose deadline is ``<= now``, earliest first."""
        return list(self.pop_due(now))

    def pop_due(self, now: int) -> Iterator[K]:
        """``due``, one key at a time: each is popped as it is taken, and those not taken stay due."""
        heap, at, queued = self._heap, self._at, self._queued
        while heap and heap[0][0] <= now:
            if self._top():
                key = heapq.heappop(heap)[2]
                del at[key], queued[key]
                yield key

    def earliest(self) -> tuple[int, K] | None:
        """The earliest live deadline and its key, or None."""
        heap = self._heap
        while heap and not self._top():
            pass
        return (heap[0][0], heap[0][2]) if heap else None
