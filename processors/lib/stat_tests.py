"""The statistics behind regressions and verdicts: exact tests on counts, a rank test on latencies, traffic floors.

Counts are compared with the *conditional binomial test*: given ``k = e_before + e_after`` errors in
``n_before + n_after`` requests, under H0 (one error rate for both) the after count is ``Binomial(k, p)`` with
``p = n_after / (n_before + n_after)``; the one-sided p-value is an exact binomial tail. Latencies are compared
with the Mann-Whitney U test on samples. Benjamini-Hochberg controls the false discovery rate across operations.

Both tests are ``scipy.stats.binomtest`` and ``scipy.stats.mannwhitneyu`` (method ``auto``) computed from the
distribution functions they call in ``scipy.special`` (the binomial tails ``bdtr``/``bdtrc``, the Clopper-Pearson
bounds by ``betaincinv``), with the ranks and the exact null distribution of U counted here: the daemon tests every
closed window, and ``scipy.stats`` costs about twice the resident memory of ``scipy.special`` and numpy.
``tests/regressions/test_stat_tests.py`` holds them to ``scipy.stats`` on random inputs. The Poisson E-test
(``scipy.stats.poisson_means_test``) is offered for the same question as the binomial test; no detector uses it.

The *zero-error rule*: a build that served ``n`` requests without one occurrence of a defect that used to occur at
rate ``p0`` is good evidence at level ``alpha`` once ``(1 - p0) ** n <= alpha``, i.e. ``n >= ln(alpha) / ln(1 - p0)``.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

Alternative = Literal["greater", "less", "two-sided"]
Side = Literal["greater", "less"]

CONDITIONAL_BINOMIAL = "conditional binomial (exact)"
POISSON_E_TEST = "Poisson E-test"
MANN_WHITNEY = "Mann-Whitney U"


@dataclass(frozen=True, slots=True)
class StatResult:
    """One test's outcome: its name, the p-value and what it measured."""

    test: str
    alternative: Alternative
    p_value: float
    statistic: float
    # Counts: exact CI of the rate ratio after/before (upper bound inf when every error is after).
    # Latency: None.
    interval: tuple[float, float] | None = None
    # Counts: after rate / before rate (inf when the before rate is 0). Latency: P(after > before).
    effect: float | None = None


def _special() -> ModuleType:
    """``scipy.special`` (with numpy), imported by the first test: a process that never tests (an ingest
    worker without proof contracts, the CLI) does not carry it."""
    return importlib.import_module("scipy.special")


def binomial_tail(k: int, n: int, p: float, alternative: Side) -> float:
    """``scipy.stats.binomtest(k, n, p, alternative).pvalue``: P(X >= k) (greater) or P(X <= k) (less), X ~ B(n, p)."""
    if alternative == "greater":
        return 1.0 if k <= 0 else float(_special().bdtrc(k - 1, n, p))
    return 1.0 if k >= n else float(_special().bdtr(k, n, p))


def proportion_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion, ``k`` successes in ``n``: what
    ``scipy.stats.binomtest(k, n).proportion_ci(confidence, method="exact")`` finds by root search, in closed form."""
    alpha = (1.0 - confidence) / 2
    special = _special()
    low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, alpha))
    high = 1.0 if k == n else float(special.betaincinv(k + 1, n - k, 1.0 - alpha))
    return (low, high)


def _check_counts(errors: int, requests: int, side: str) -> None:
    if requests <= 0:
        raise ValueError(f"{side}: requests must be > 0, got {requests}")
    if not 0 <= errors <= requests:
        raise ValueError(f"{side}: errors must be within 0..requests, got {errors}/{requests}")


def _ratio(pi: float, n_before: int, n_after: int) -> float:
    """A binomial proportion of the after side as a rate ratio after/before."""
    return math.inf if pi >= 1.0 else (pi / (1.0 - pi)) * (n_before / n_after)


def conditional_binomial(
    errors_before: int,
    requests_before: int,
    errors_after: int,
    requests_after: int,
    alternative: Side = "greater",
    confidence: float = 0.95,
) -> StatResult:
    """Exact test of equal error rates: ``greater`` = the after rate is higher, ``less`` = it dropped."""
    _check_counts(errors_before, requests_before, "before")
    _check_counts(errors_after, requests_after, "after")
    k = errors_before + errors_after
    rate_before = errors_before / requests_before
    rate_after = errors_after / requests_after
    effect = rate_after / rate_before if rate_before else (math.inf if rate_after else 1.0)
    name = f"one-sided {CONDITIONAL_BINOMIAL}"
    if k == 0:
        return StatResult(name, alternative, 1.0, 0.0, None, effect)
    p_value = binomial_tail(errors_after, k, requests_after / (requests_before + requests_after), alternative)
    low, high = proportion_interval(errors_after, k, confidence)
    interval = (_ratio(low, requests_before, requests_after), _ratio(high, requests_before, requests_after))
    return StatResult(name, alternative, p_value, float(errors_after), interval, effect)


def poisson_e_test(
    errors_before: int,
    requests_before: int,
    errors_after: int,
    requests_after: int,
    alternative: Alternative = "greater",
) -> StatResult:
    """The E-test of Krishnamoorthy and Thomson on the same counts (``greater`` = after rate higher)."""
    _check_counts(errors_before, requests_before, "before")
    _check_counts(errors_after, requests_after, "after")
    stats = importlib.import_module("scipy.stats")  # only here: see the module docstring
    result = stats.poisson_means_test(errors_after, requests_after, errors_before, requests_before,
                                       alternative=alternative)  # fmt: skip
    rate_before = errors_before / requests_before
    rate_after = errors_after / requests_after
    effect = rate_after / rate_before if rate_before else (math.inf if rate_after else 1.0)
    p_value = float(result.pvalue)
    return StatResult(POISSON_E_TEST, alternative, min(max(p_value, 0.0), 1.0), float(result.statistic), None, effect)


def mann_whitney(before: Sequence[float], after: Sequence[float], alternative: Alternative = "greater") -> StatResult:
    """Rank test on latency samples: ``greater`` = after latencies are stochastically larger.

    ``effect`` is the common-language effect size P(after > before) + P(tie) / 2 = U / (n_after * n_before).
    As ``scipy.stats.mannwhitneyu(after, before, alternative, method="auto")``: the exact null distribution of U when
    a side has at most 8 samples and no value is tied, else the normal approximation with the tie and continuity
    corrections. Every value tied (no variance) is no evidence either way: p = 1.
    """
    n1, n2 = len(after), len(before)
    if not n1 or not n2:
        raise ValueError("Mann-Whitney needs at least one sample on each side")
    rank_sum, tie_term = _rank_sum(list(after) + list(before), n1)
    u1 = rank_sum - n1 * (n1 + 1) / 2
    u2 = n1 * n2 - u1
    u, factor = (u1, 1) if alternative == "greater" else (u2, 1) if alternative == "less" else (max(u1, u2), 2)
    if (n1 <= 8 or n2 <= 8) and not tie_term:
        p_value = _exact_u_sf(int(u), n1, n2)
    else:
        n = n1 + n2
        sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
        z = (u - n1 * n2 / 2 - 0.5) / sigma if sigma > 0 else -math.inf
        p_value = 0.5 * math.erfc(z / math.sqrt(2))  # the standard normal's survival function at z
    return StatResult(MANN_WHITNEY, alternative, min(max(p_value * factor, 0.0), 1.0), u1, None, u1 / (n1 * n2))


def _rank_sum(values: list[float], first: int) -> tuple[float, int]:
    """The sum of the average ranks of ``values[:first]`` in ``values``, and the tie term sum(t**3 - t) over groups of
    ``t`` equal values."""
    order = sorted(range(len(values)), key=values.__getitem__)
    total, tie_term, i = 0.0, 0, 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        rank = (i + j + 2) / 2  # ranks i+1 .. j+1, averaged
        total += rank * sum(1 for t in order[i : j + 1] if t < first)
        tie_term += (j - i + 1) ** 3 - (j - i + 1)
        i = j + 1
    return total, tie_term


@functools.lru_cache(maxsize=64)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """How many of the C(n1 + n2, n1) orderings give each U = 0 .. n1 * n2 (no ties): the coefficients of the Gaussian
    binomial prod_{i=1..m} (1 - q**(n + i)) / (1 - q**i) with m = min(n1, n2), in integers (exact)."""
    m, n = min(n1, n2), max(n1, n2)
    top = m * n
    counts = [1] + [0] * top
    for i in range(1, m + 1):
        for j in range(top, n + i - 1, -1):  # times (1 - q**(n + i)); beyond ``top`` it is 0 after the division
            counts[j] -= counts[j - n - i]
        for j in range(i, top + 1):  # divided by (1 - q**i): a power series, exact as the quotient is a polynomial
            counts[j] += counts[j - i]
    return tuple(counts)


def _exact_u_sf(u: int, n1: int, n2: int) -> float:
    """P(U >= u) under H0, exactly."""
    counts = _u_counts(n1, n2)
    return sum(counts[max(u, 0) :]) / math.comb(n1 + n2, n1)


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up, monotone, capped at 1), in the input order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m / rank)
        adjusted[i] = min(running, 1.0)
    return adjusted


def zero_error_upper_bound(requests: int, alpha: float = 0.05) -> float:
    """One-sided ``1 - alpha`` upper bound of a rate after ``requests`` requests without an error."""
    if requests <= 0:
        return 1.0
    return 1.0 - float(alpha ** (1.0 / requests))


def rate_interval(errors: int, requests: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of an error rate; with no error, the one-sided upper bound from 0."""
    if requests <= 0:
        return (0.0, 1.0)
    if errors == 0:
        return (0.0, zero_error_upper_bound(requests, 1.0 - confidence))
    return proportion_interval(errors, requests, confidence)


def requests_to_show_drop(errors_before: int, requests_before: int, alpha: float = 0.05) -> int | None:
    """Error-free after-requests for the one-sided conditional binomial test to show a drop at ``alpha``.

    With 0 errors after, p = (n_before / (n_before + n_after)) ** k; None when ``k = 0`` (nothing to drop from).
    """
    if errors_before <= 0 or requests_before <= 0:
        return None
    factor = float(alpha ** (-1.0 / errors_before)) - 1.0
    return max(1, math.ceil(requests_before * factor - 1e-9))


def errors_needed(share_after: float, alpha: float = 0.05) -> int:
    """Fewest errors that, all falling on the after side, would be significant at ``alpha``.

    ``share_after`` is the after side's share of the traffic, p in the conditional binomial test: p ** k <= alpha.
    """
    if not 0 < share_after < 1:
        return 1
    return max(1, math.ceil(math.log(alpha) / math.log(share_after) - 1e-9))
