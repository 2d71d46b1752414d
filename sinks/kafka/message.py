"""One message to produce: topic, key, value, headers and, optionally, the partition it must go to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Message:
    """One message to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None  # None: by key (or the producer's choice when there is no key)
