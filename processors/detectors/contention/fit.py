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


def rank_correlation(pairs: Sequence[tuple[int, int, float]]) -> tuple[float, float, int]:
    """(rho, one-sided p, windows) of ``(window, concurrency, latency)`` pairs ranked within their window."""
    from scipy import stats

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
