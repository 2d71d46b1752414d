"""Tumbling event-time windows: one helper for every windowed aggregate (CALLS edges, service statistics).

An event at time ``t`` folds into the window starting at ``t - t % size``. A window closes once the watermark is
past its end plus ``grace`` (for trace aggregates: the trace gap, so every trace that started in it has closed)
and no trace still open (started at ``open_since``) can reach it. Input for a window already closed is late: it
is counted (``<name>_late``) and left out, never a partial overwrite of an emitted window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.model.units import MS_NS
from processors.state.keyed import KeyedState

A = TypeVar("A")


@dataclass(frozen=True, slots=True)
class ClosedWindow(Generic[A]):
    """An emitted window: ``window_id`` is ``"<start ms>-<end ms>"``, stable across replays."""

    window_id: str
    start_ns: int
    end_ns: int
    value: A


def ready_windows(starts: Iterable[int], watermark_ns: int, size_ns: int, grace_ns: int,
                  open_since_ns: int | None) -> list[int]:  # fmt: skip
    """Starts of the windows that may close, in order: past ``end + grace`` on the watermark, and not reachable by
    a trace still open since ``open_since_ns``."""
    limit = watermark_ns - size_ns - grace_ns
    if open_since_ns is not None:
        limit = min(limit, open_since_ns - size_ns)
    return sorted(s for s in starts if s <= limit)


class TumblingWindows(Generic[A]):
    """Aggregates of type ``A`` per tumbling window; see the module docstring."""

    __slots__ = ("_closed_before", "_last", "_last_value", "_retained", "_state", "grace_ns", "name", "size_ns",
                 "telemetry")  # fmt: skip

    def __init__(
        self,
        name: str,
        size_ns: int,
        grace_ns: int,
        new: Callable[[int], A],
        *,
        max_windows: int = 1_000,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.name = name
        self.size_ns = size_ns
        self.grace_ns = grace_ns
        self.telemetry = (telemetry or Telemetry(name)).declare(name + "_late")
        self._state: KeyedState[int, A] = KeyedState(
            name, bound=max_windows, new=new, telemetry=self.telemetry, events=events
        )
        self._closed_before = 0  # windows starting before this have been emitted
        # The window the last lookup retained (None: none, or it closed), the most recent key of ``_state``.
        self._last: int | None = None
        self._last_value: A | None = None
        self._retained = events.retained

    def __len__(self) -> int:
        return len(self._state)

    def at(self, event_ns: int) -> A | None:
        """The open window aggregate for ``event_ns`` (retaining the input being processed), or None when that
        window has closed already (counted as late)."""
        start = event_ns - event_ns % self.size_ns
        if start == self._last:
            # The window the previous lookup retained (most traces fall in the newest window): open, and already
            # the most recent key, so only the input being processed is reported (once a trace per processor).
            self._retained(self.name, start)
            return self._last_value
        if start < self._closed_before:
            self.telemetry.drop(self.name + "_late")
            return None
        value = self._last_value = self._state.retain(start)
        self._last = start
        return value

    def each(self, change: Callable[[A], object]) -> None:
        """Apply ``change`` to every open window's aggregate (e.g. drop a revoked partition's part of it)."""
        for _, value in self._state.items():
            change(value)

    def close_until(self, watermark_ns: int, open_since_ns: int | None = None) -> list[ClosedWindow[A]]:
        """Emit (and forget) every window that may close at ``watermark_ns``; see :func:`ready_windows`."""
        ready = ready_windows(list(self._state), watermark_ns, self.size_ns, self.grace_ns, open_since_ns)
        if ready:
            self._closed_before = max(self._closed_before, ready[-1] + self.size_ns)
            if self._last is not None and self._last < self._closed_before:
                self._last = self._last_value = None
        closed = []
        for start in ready:
            value = self._state.discard(start)
            assert value is not None
            end = start + self.size_ns
            closed.append(ClosedWindow(f"{start // MS_NS}-{end // MS_NS}", start, end, value))
        self.telemetry.count("windows_closed", len(closed))
        return closed
