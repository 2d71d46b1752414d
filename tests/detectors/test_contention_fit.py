"""The contention test's rank correlation, without ``scipy.stats``: the numbers ``scipy.stats`` gives (to its last
bits)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
from scipy import stats

from processors.detectors.contention.fit import rank_correlation


def reference(pairs: list[tuple[int, int, float]]) -> tuple[float, float, int]:
    """What ``rank_correlation`` computed with ``scipy.stats.rankdata`` and ``scipy.stats.pearsonr``."""
    by_window: dict[int, list[tuple[int, float]]] = {}
    for w, c, ms in pairs:
        by_window.setdefault(w, []).append((c, ms))
    xs: list[float] = []
    ys: list[float] = []
    for group in by_window.values():
        n = len(group)
        if n < 3:
            continue
        xs += [(r - 0.5) / n for r in stats.rankdata([c for c, _ in group])]
        ys += [(r - 0.5) / n for r in stats.rankdata([ms for _, ms in group])]
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return 0.0, 1.0, len(by_window)
    result = stats.pearsonr(xs, ys, alternative="greater")
    return float(result.statistic), float(result.pvalue), len(by_window)


@pytest.mark.parametrize("seed", range(40))
def test_rank_correlation_is_scipy_stats(seed: int) -> None:
    """Random windows of pairs, with ties in both concurrency and latency, correlated or not."""
    rng = random.Random(seed)
    slope = rng.choice([0.0, 0.3, 2.0, -1.0])
    pairs = []
    for w in range(rng.randint(1, 6)):
        for _ in range(rng.randint(2, 200)):
            c = rng.randint(0, 12)
            pairs.append((w, c, round(10 + slope * c + rng.expovariate(0.2), rng.choice([0, 1, 3]))))
    rho, p, windows = rank_correlation(pairs)
    want_rho, want_p, want_windows = reference(pairs)
    assert windows == want_windows
    assert rho == pytest.approx(want_rho, abs=1e-12)
    # r can differ from scipy's in its last bits (the order of its sums): at r = 1 that is p 0 against 4e-39
    assert p == pytest.approx(want_p, rel=1e-6) or max(p, want_p) < 1e-30


def test_rank_correlation_does_not_import_scipy_stats() -> None:
    """The daemon runs it at every window with enough pairs: ``scipy.stats`` would add ~50 MB to its peak."""
    code = ("import sys; from processors.detectors.contention.fit import rank_correlation; "
            "rank_correlation([(0, c, 10.0 + c * (c % 3)) for c in range(50)]); "
            "print('scipy.stats' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("seed", range(20))
def test_ranks_are_scipy_rankdata_exactly(seed: int) -> None:
    """The within-window ranks are ``scipy.stats.rankdata``'s to the bit (ties averaged): the test's rho and p
    depend on nothing else, so a change in them would change every contention finding's numbers."""
    from processors.detectors.contention.fit import _ranks

    rng = random.Random(seed)
    values = [rng.choice([rng.randint(0, 5), round(rng.expovariate(0.1), 1)]) for _ in range(rng.randint(1, 500))]
    assert _ranks(values).tolist() == stats.rankdata(values).tolist()
