"""The sink runner's backoff (jittered, exponential, capped, never under Retry-After) and its de-duplication key."""

from __future__ import annotations

import random
from typing import ClassVar, Literal

from processors.model.base import Published
from streamer.runtime.sink_runner import Backoff, event_key
from tests.gitlab.helpers import incident


def test_backoff_is_jittered_exponential_and_capped() -> None:
    """Attempt n waits between half and all of min(cap, base * 2^(n-1)), with spread, and never more than the cap."""
    for attempt, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 4.0), (60, 4.0)):
        waits = []
        for seed in range(40):
            backoff = Backoff(0.5, 4.0, random.Random(seed))
            waits.append([backoff.next() for _ in range(attempt)][-1])
        assert all(ceiling / 2 <= w <= ceiling for w in waits) and len(set(waits)) > 1, attempt


def test_backoff_waits_at_least_retry_after_and_resets() -> None:
    """A Retry-After longer than the backoff is waited in full; a reset starts from the base again."""
    backoff = Backoff(0.5, 4.0, random.Random(1))
    assert backoff.next(at_least=90.0) == 90.0 and backoff.next(at_least=0.01) >= 0.5
    backoff.reset()
    assert backoff.next() <= 0.5 and backoff.attempt == 1


class Note(Published):
    """A kind without identity fields."""

    identity: ClassVar[tuple[str, ...]] = ()
    kind: Literal["note"] = "note"
    text: str


def test_event_key_is_the_event_id_or_a_digest_without_identity() -> None:
    """Events with identity fields are keyed by ``event_id``; events without are told apart by their content."""
    e = incident()
    assert event_key(e) == e.event_id and event_key(e.model_copy(update={"summary": "changed"})) == e.event_id
    assert event_key(Note(text="a")) != event_key(Note(text="b")) and event_key(Note(text="a")) == event_key(
        Note(text="a")
    )
