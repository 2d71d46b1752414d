"""One base for every sink (and every sink-shaped connector, such as the repro worker): ``write`` events,
``flush`` them durably, report health, ``close``.

Commit order (written where it is enforced, in ``streamer.runtime``): a sink's ``flush`` returns only when every
event written before it is durable at its destination; the runtime commits the input offsets after that. A sink
tells the runtime how it failed: :class:`RetryableSinkError` (destination down, rate limited, disk full: keep the
events, retry later, never commit past them) or :class:`PermanentSinkError` (this event can never be accepted:
count it and go on). Sinks are idempotent per event (``Published.event_id``): the runtime may deliver an event
again after a crash or a rebalance. A retryable failure is retried after a :class:`Backoff` delay.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod

from processors.model.base import Published


class RetryableSinkError(RuntimeError):
    """The sink could not deliver now (service down, rate limited, disk full): keep the input, retry later.

    ``retry_after_s`` is the destination's own hint (HTTP ``Retry-After``), when it gave one.
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Backoff:
    """Equal-jitter exponential delays before retrying a destination (the one retry delay of the runtime, its sinks
    and the Kafka producer): attempt n waits between half and all of ``min(cap, base * 2^(n-1))``."""

    __slots__ = ("attempt", "base_s", "cap_s", "rng")

    def __init__(self, base_s: float, cap_s: float, rng: random.Random | None = None) -> None:
        self.base_s, self.cap_s, self.rng = base_s, cap_s, rng or random.Random()
        self.attempt = 0

    def next(self, at_least: float | None = None) -> float:
        """The next delay, never under ``at_least`` (a destination's own hint, such as ``Retry-After``)."""
        self.attempt += 1
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(self.attempt - 1, 30))
        delay = ceiling / 2 + self.rng.uniform(0, ceiling / 2)
        return max(delay, at_least or 0.0)

    def reset(self) -> None:
        self.attempt = 0


class PermanentSinkError(RuntimeError):
    """The sink refused an event for good: retrying it unchanged cannot succeed; count it and move on."""


class Sink(ABC):
    """A destination of published events; see the module docstring."""

    name: str = "sink"

    @abstractmethod
    async def write(self, event: Published) -> None:
        """Accept ``event`` (buffer or queue it); kinds the sink does not handle are ignored."""

    @abstractmethod
    async def flush(self) -> None:
        """Make every written event durable, or raise one of the two errors above."""

    async def healthcheck(self) -> bool:
        """True while the sink can deliver (``/readyz`` turns 503 when one sink says False)."""
        return True

    async def close(self) -> None:  # noqa: B027 - a sink without resources needs no close
        """Release resources; events not flushed are dropped (they are replayed from Kafka)."""
