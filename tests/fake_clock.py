"""A wall clock for tests: nanoseconds that move only when the test moves them."""

from __future__ import annotations

NS = 1_000_000_000


class FakeClock:
    """Callable returning the current fake wall time in nanoseconds."""

    def __init__(self, now_ns: int = 1_000 * NS) -> None:
        self.now = now_ns

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * NS)
