"""How processors tell the runtime which input their state still holds, without ever seeing an offset.

A processor keeps its state in named stores of keys (:class:`~processors.state.keyed.KeyedState`). When input
feeds a key, the store reports the key *retained*; when the processor no longer needs the input behind a key
(the trace closed, the window was emitted, the entity was judged) or drops the key, the store reports it
*released*. The runtime implements :class:`StateEvents`: it knows which input record is being processed, maps
retained keys to those records' offsets (pins), and releases the pins once the batch that released the key is
durable. Processors in unit tests use :data:`NO_EVENTS`.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class StateEvents(Protocol):
    def retained(self, store: str, key: Hashable) -> None:
        """The input being processed now feeds ``key`` of ``store``."""

    def released(self, store: str, key: Hashable) -> None:
        """``key`` of ``store`` no longer needs the input that fed it."""


class _NoEvents:
    __slots__ = ()

    def retained(self, store: str, key: Hashable) -> None:
        pass

    def released(self, store: str, key: Hashable) -> None:
        pass


NO_EVENTS: StateEvents = _NoEvents()
