"""An operation's recent pairs keep each window's ranks between tests: the test must give what ranking every pair
again gives, bit for bit, as windows come and the bound cuts the oldest."""

from __future__ import annotations

import random

import pytest

from processors.detectors.contention.fit import rank_correlation
from processors.detectors.contention.recent import RecentPairs


@pytest.mark.parametrize("seed", range(30))
def test_correlation_is_rank_correlation_of_the_pairs_held(seed: int) -> None:
    rng = random.Random(seed)
    max_pairs = rng.choice([5, 40, 100, 300])
    recent = RecentPairs(max_pairs)
    slope = rng.choice([0.0, 0.5, 3.0])
    held: list[tuple[int, int, float]] = []  # what a plain bounded list would hold
    for window in range(rng.randint(1, 25)):
        n = rng.choice([0, 1, 2, 3, rng.randint(4, 120), rng.randint(200, 400)])
        pairs = [(window, c, round(5 + slope * c + rng.expovariate(0.3), rng.choice([0, 2])))
                 for c in (rng.randint(1, 10) for _ in range(n))]  # fmt: skip
        recent.extend(window, pairs)
        held = (held + pairs)[-max_pairs:]
        assert list(recent) == held
        assert recent.correlation() == rank_correlation(held)  # exactly: the same ranks, pooled in the same order


def test_a_window_cut_by_the_bound_is_ranked_again() -> None:
    """The oldest window loses pairs to the bound: its ranks are those of the pairs left, not of the pairs it had."""
    recent = RecentPairs(8)
    recent.extend(0, [(0, c, 10.0 * c) for c in range(5)])  # window 0 rises with concurrency
    recent.extend(1, [(1, c, 30.0 - 10.0 * c) for c in range(3)])  # window 1 falls
    recent.correlation()  # both windows' ranks kept
    recent.extend(2, [(2, 1, 1.0)])  # window 0 now holds 4 pairs (c = 1..4)
    assert [p[0] for p in recent] == [0] * 4 + [1] * 3 + [2]
    assert recent.correlation() == rank_correlation(list(recent))
    assert recent.correlation()[2] == 3


def test_windows_out_of_order_are_refused() -> None:
    recent = RecentPairs(10)
    recent.extend(3, [(3, 1, 1.0)])
    with pytest.raises(ValueError, match="window 3 after window 3"):
        recent.extend(3, [(3, 2, 1.0)])
