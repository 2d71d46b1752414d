"""An entity's pending input: released by time from a heap, it must give what a walk of every key gives."""

from __future__ import annotations

import random

import pytest

from processors.detectors.collisions.pending import PendingInputs


@pytest.mark.parametrize("seed", range(40))
def test_release_and_oldest_are_those_of_a_walk_of_every_key(seed: int) -> None:
    rng = random.Random(seed)
    pending, model = PendingInputs(), dict[tuple[str, str], int]()  # the model: key -> time, walked whole
    keys = [("orders:*", f"t{i}") for i in range(rng.choice([3, 30, 300]))]
    now = 0
    for _ in range(2_000):
        r = rng.random()
        key = rng.choice(keys)
        if r < 0.6:
            at = max(model.get(key, 0), now + rng.randint(0, 50))  # a key is held to its latest time
            pending.hold(key, at)
            model[key] = at
        elif r < 0.7:
            pending.discard(key)
            model.pop(key, None)
        else:
            now += rng.randint(0, 20)
            want = sorted(k for k, at in model.items() if at <= now)
            assert sorted(pending.release_until(now)) == want
            for k in want:
                del model[k]
            assert pending.oldest() == min(model.values(), default=None)
        assert len(pending) == len(model) and set(pending) == set(model)
        assert len(pending._heap) <= 2 * len(model) + 65  # entries left behind are bounded by the keys


def test_a_key_held_later_is_released_at_its_later_time() -> None:
    pending = PendingInputs()
    pending.hold(("orders:1", "a"), 10)
    pending.hold(("orders:1", "a"), 30)  # the trace's later statement on the row
    assert pending.release_until(20) == []
    assert pending.oldest() == 30
    assert pending.release_until(30) == [("orders:1", "a")]
    assert pending.oldest() is None and not pending
