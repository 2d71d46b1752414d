"""One copy of each repeated string of decoded events: what stage 2 holds for a while is mostly the same few strings.

``json`` makes a new ``str`` for every value it reads, so each access stage 2 keeps (in the correlator's and the
collision detector's histories, until event time passes it) carried its own copy of its statement, table, service,
code location and predicates, though a service sends few distinct statements among many accesses.
A :class:`SharedStrings` table hands back the first copy it saw. It is bounded by generations, not by recency (a
lookup is one ``dict.setdefault`` in C, cheaper than the LRU bookkeeping it would need): :meth:`SharedStrings.bound`,
called once per decoded event, empties a table grown past its capacity and counts what it held as dropped
(``max_shared_strings``); the strings still in use are shared again from the next event on. Strings that never
repeat (span ids) are not offered to it.
"""

from __future__ import annotations

from processors.api.telemetry import Telemetry


class SharedStrings:
    """``shared(s)``: the copy of ``s`` seen first (since the table last started again), else ``s``, remembered."""

    __slots__ = ("capacity", "table", "telemetry")

    def __init__(self, capacity: int, telemetry: Telemetry | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.table: dict[str, str] = {}  # read directly by hot loops: ``table.setdefault(s, s)`` is ``shared(s)``
        self.telemetry = telemetry.declare("max_shared_strings") if telemetry is not None else None

    def __len__(self) -> int:
        return len(self.table)

    def __call__(self, s: str) -> str:
        return self.table.setdefault(s, s)

    def bound(self) -> None:
        """Past its capacity (by at most one event's strings), the table starts again; what it held is counted."""
        if len(self.table) > self.capacity:
            if self.telemetry is not None:
                self.telemetry.drop("max_shared_strings", len(self.table))
            self.table.clear()
