"""A component's own telemetry: drops by reason, event counts, state gauges.

Components count into plain dicts (no Prometheus object on the hot path, no lock: a counter is bumped by the one
thread that runs the component); the runtime exports every component's telemetry at scrape time, labelled with the
component's name: ``trace_repro_dropped_total{component, reason}``, ``trace_repro_component_events_total{component,
event}`` and ``trace_repro_component_state{component, state}``. A bound that is hit is a drop whose reason names the
bound (``max_open_traces``), so every bound of the daemon shows on /metrics the moment it first drops something.
"""

from __future__ import annotations


class Telemetry:
    """Counters and gauges of one component; see the module docstring."""

    __slots__ = ("component", "dropped", "events", "state")

    def __init__(self, component: str) -> None:
        self.component = component
        self.dropped: dict[str, int] = {}  # reason -> events dropped (monotonic)
        self.events: dict[str, int] = {}  # event -> count (monotonic)
        self.state: dict[str, float] = {}  # gauge name -> current value

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` events dropped for ``reason`` (a bound's name, ``late``, ``invalid``, ...)."""
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def count(self, event: str, n: int = 1) -> None:
        if n:
            self.events[event] = self.events.get(event, 0) + n

    def gauge(self, name: str, value: float) -> None:
        self.state[name] = value

    def declare(self, *reasons: str) -> Telemetry:
        """Make drop reasons visible at 0 before the first drop (so that ``increase()`` sees the first one)."""
        for reason in reasons:
            self.dropped.setdefault(reason, 0)
        return self
