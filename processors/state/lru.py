"""One bounded least-recently-used map, whose evictions are counted: every cache and memory of the daemon."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

from processors.api.telemetry import Telemetry

K = TypeVar("K")
V = TypeVar("V")


class CountedLRU(Generic[K, V]):
    """At most ``capacity`` entries; inserting one more evicts the least recently used, counted as a drop.

    ``telemetry.drop(reason)`` counts each eviction (``reason`` names the bound, e.g. ``statement_cache``).
    Reading with :meth:`get` refreshes an entry; ``in`` does not. Use ``None`` values for a bounded set.
    """

    __slots__ = ("_data", "capacity", "reason", "telemetry")

    def __init__(self, capacity: int, telemetry: Telemetry | None = None, reason: str = "lru_bound") -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.telemetry = telemetry
        self.reason = reason
        self._data: OrderedDict[K, V] = OrderedDict()
        if telemetry is not None:
            telemetry.declare(reason)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key`` (now the most recently used), or ``default``."""
        try:
            value = self._data[key]
        except KeyError:
            return default
        self._data.move_to_end(key)
        return value

    def peek(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key`` without refreshing it."""
        return self._data.get(key, default)

    def put(self, key: K, value: V) -> list[tuple[K, V]]:
        """Insert or replace ``key``; returns the entries evicted to stay within the bound (oldest first)."""
        data = self._data
        if key in data:
            data.move_to_end(key)
            data[key] = value
            return []
        data[key] = value
        evicted: list[tuple[K, V]] = []
        while len(data) > self.capacity:
            evicted.append(data.popitem(last=False))
        if evicted and self.telemetry is not None:
            self.telemetry.drop(self.reason, len(evicted))
        return evicted

    def add(self, key: K) -> bool:
        """Set-like insert (value ``None``); True when ``key`` was not there yet."""
        if key in self._data:
            self._data.move_to_end(key)
            return False
        self.put(key, None)  # type: ignore[arg-type]
        return True

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._data.pop(key, default)

    def oldest(self) -> tuple[K, V] | None:
        if not self._data:
            return None
        key = next(iter(self._data))
        return key, self._data[key]

    def values(self) -> Iterator[V]:
        return iter(self._data.values())

    def items(self) -> Iterator[tuple[K, V]]:
        return iter(self._data.items())

    def clear(self) -> None:
        self._data.clear()
