"""The test: does an operation's latency rise with its in-flight concurrency at start?

Stratified Spearman rank correlation: concurrency and latency are ranked within each window (so a shift of both
between windows, a slower build raising in-flight counts by Little's law, is no evidence) and the pooled within-window
ranks are correlated, with the t-test's one-sided p-value. The effect is the Theil-Sen slope of latency on
concurrency over every pair (with its 95 % interval) and the fitted latency at the 90th percentile concurrency
over that at the 10th. scipy is imported on first use (the daemon's start must not import it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:  # numpy is imported at the first test (the daemon's start does not import it)
    import numpy as np
    from numpy.typing import NDArray

Ranked: TypeAlias = "tuple[NDArray[np.float64], NDArray[np.float64]] | None"  # a window's ranks (``window_ranks``)
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


def _ranks(values: Sequence[float]) -> NDArray[np.float64]:
    """``scipy.stats.rankdata``: ranks from 1, ties given their average (its algorithm: a stable sort, then each
    run of equal values given the mean of its first and last rank, exact in binary)."""
    import numpy as np

    a = np.asarray(values)
    order = np.argsort(a, kind="stable")
    where = np.empty(order.size, dtype=np.intp)
    where[order] = np.arange(order.size)
    a = a[order]
    first = np.concatenate(([True], a[1:] != a[:-1]))
    run = np.cumsum(first)[where]  # each value's run of equal values, from 1
    bounds = np.concatenate((np.nonzero(first)[0], [a.size]))  # where each run starts, and the end
    ranks: NDArray[np.float64] = 0.5 * (bounds[run] + bounds[run - 1] + 1)
    return ranks


def _pearson_greater(
    xs: Sequence[float] | NDArray[np.float64], ys: Sequence[float] | NDArray[np.float64]
) -> tuple[float, float]:
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


def window_ranks(group: Sequence[tuple[int, float]]) -> Ranked:
    """One window's ``(concurrency, latency)`` pairs as their within-window ranks, each ``(rank - 0.5) / n``; None
    for a window of fewer than 3 pairs (no ranks to correlate)."""
    n = len(group)
    if n < 3:
        return None
    return (_ranks([c for c, _ in group]) - 0.5) / n, (_ranks([ms for _, ms in group]) - 0.5) / n


def correlate(ranked: Iterable[Ranked], windows: int) -> tuple[float, float, int]:
    """(rho, one-sided p, windows) of windows' ranks (``window_ranks``), pooled in their order."""
    import numpy as np

    kept = [r for r in ranked if r is not None]
    if not kept:
        return 0.0, 1.0, windows
    xs, ys = np.concatenate([x for x, _ in kept]), np.concatenate([y for _, y in kept])
    if xs.size < 3 or xs.min() == xs.max() or ys.min() == ys.max():  # fewer than two distinct ranks: no test
        return 0.0, 1.0, windows
    rho, p = _pearson_greater(xs, ys)
    return rho, p, windows


def rank_correlation(pairs: Sequence[tuple[int, int, float]]) -> tuple[float, float, int]:
    """(rho, one-sided p, windows) of ``(window, concurrency, latency)`` pairs ranked within their window."""
    by_window: dict[int, list[tuple[int, float]]] = {}
    for w, c, ms in pairs:
        by_window.setdefault(w, []).append((c, ms))
    return correlate(map(window_ranks, by_window.values()), len(by_window))


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
