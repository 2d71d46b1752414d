"""Bounded, keyed, event-time state for processors: the runtime learns from it which input is still needed."""

from processors.api.provenance import NO_EVENTS, StateEvents
from processors.state.keyed import Deadlines, KeyedState
from processors.state.lru import CountedLRU
from processors.state.windows import ClosedWindow, TumblingWindows

__all__ = ["NO_EVENTS", "ClosedWindow", "CountedLRU", "Deadlines", "KeyedState", "StateEvents", "TumblingWindows"]
