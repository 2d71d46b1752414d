"""The one exception every decoder raises for a message it cannot turn into events."""

from __future__ import annotations


class DecodeError(ValueError):
    """A message that cannot be decoded; ``reason`` is a short machine label for metrics and dead letters."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(reason, message)  # both in args, so the error pickles and copies intact
        self.reason = reason
        self.message = message or reason

    def __str__(self) -> str:
        return self.reason if self.message == self.reason else f"{self.reason}: {self.message}"


class DecodeUnavailable(RuntimeError):
    """What decoding needs from another service (a schema registry) cannot be had now: retry the batch later."""
