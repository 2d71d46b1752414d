"""The test: does an operation's latency rise with its in-flight concurrency at start?

Stratified Spearman rank correlation: concurrency and latency are ranked within each window (so a shift of both
between windows, a slower build raising in-flight counts by Little's law, is no evidence) and the pooled within-window
ranks are correlated, with the t-test's one-sided p-value. The effect is the Theil-Sen slope of latency on
concurrency over every pair (with its 95 % interval) and the fitted latency at the 90th percentile concurrency
over that at the 10th. scipy is imported on first use (the daemon's start must not import it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TEST = "stratified Spearman rank correlation (ranks within each window), one-sided t-test"


@dataclass(frozen=True, slots=True)
class Fit:
    pairs: int
    windows: int
    rho: float
    p_value: float
    slope: float  # ms per request in flight (Theil-Sen)
    slope_low: float
    slope_high: float
    intercept: float
    c_low: float  # 10th percentile concurrency
    c_high: float  # 90th
    at_low_ms: float
    at_high_ms: float

    @property
    def ratio(self) -> float:
        return self.at_high_ms / self.at_low_ms if self.at_low_ms > 0 else math.inf


def _ranks(values: Sequence[float]) -> list[float]:
    """``scipy.stats.rankdata``: ranks from 1, ties given their average."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _pearson_greater(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """``scipy.stats.pearsonr(xs, ys, alternative="greater")``: r and ``P(R >= r)``, R ~ Beta(n/2 - 1, n/2 - 1) on
    (-1, 1), as it computes them, from ``scipy.special`` and numpy (a fraction of ``scipy.stats``' memory: the
    daemon imports it at the first window with enough pairs)."""
    import numpy as np
    from scipy.special import betaincc

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    xm, ym = x - x.mean(), y - y.mean()
    xmax, ymax = np.abs(xm).max(), np.abs(ym).max()
    r = float(np.clip(np.dot(xm / (xmax * np.linalg.norm(xm / xmax)), ym / (ymax * np.linalg.norm(ym / ymax))), -1, 1))
    ab = len(xs) / 2 - 1
    return r, float(betaincc(ab, ab, (r + 1) / 2))


def rank_correlation(pairs: Sequence[tuple[int, int, float]]) -> tuple[float, float, int]:
    """(rho, one-sided p, windows) of ``(window, concurrency, latency)`` pairs ranked within their window."""
    by_window: dict[int, list[tuple[int, float]]] = {}
    for w, c, ms in pairs:
        by_window.setdefault(w, []).append((c, ms))
    xs: list[float] = []
    ys: list[float] = []
    for group in by_window.values():
        n = len(group)
        if n < 3:
            continue
        xs += [(r - 0.5) / n for r in _ranks([c for c, _ in group])]
        ys += [(r - 0.5) / n for r in _ranks([ms for _, ms in group])]
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return 0.0, 1.0, len(by_window)
    rho, p = _pearson_greater(xs, ys)
    return rho, p, len(by_window)


def fit(pairs: Sequence[tuple[int, int, float]]) -> Fit:
    """The test and the effect over ``(window, concurrency, latency)`` pairs; see the module docstring."""
    from scipy import stats

    rho, p, windows = rank_correlation(pairs)
    conc = [float(c) for _, c, _ in pairs]
    lat = [ms for _, _, ms in pairs]
    slope, intercept, low, high = (float(v) for v in stats.theilslopes(lat, conc, alpha=0.95))
    ranked = sorted(conc)
    c_low, c_high = ranked[len(ranked) // 10], ranked[(9 * len(ranked)) // 10]
    return Fit(len(pairs), windows, rho, p, slope, low, high, intercept, c_low, c_high,
               intercept + slope * c_low, intercept + slope * c_high)  # fmt: skip
