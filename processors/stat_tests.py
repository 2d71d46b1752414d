"""The statistics behind regressions and verdicts: exact tests on counts, a rank test on latencies, traffic floors.

Counts are compared with the *conditional binomial test*: given ``k = e_before + e_after`` errors in
``n_before + n_after`` requests, under H0 (one error rate for both) the after count is ``Binomial(k, p)`` with
``p = n_after / (n_before + n_after)``; the one-sided p-value is an exact binomial tail (``scipy.stats.binomtest``).
The Poisson E-test (``scipy.stats.poisson_means_test``) is offered for the same question. Latencies are compared
with the Mann-Whitney U test on samples. Benjamini-Hochberg controls the false discovery rate across operations.

The *zero-error rule*: a build that served ``n`` requests without one occurrence of a defect that used to occur at
rate ``p0`` is good evidence at level ``alpha`` once ``(1 - p0) ** n <= alpha``, i.e. ``n >= ln(alpha) / ln(1 - p0)``.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

Alternative = Literal["greater", "less", "two-sided"]

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


def _stats() -> ModuleType:
    """``scipy.stats``, imported by the first test: it is 87 MB of resident memory that an ingest worker, which never
    tests anything, does not carry."""
    return importlib.import_module("scipy.stats")


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
    alternative: Alternative = "greater",
    confidence: float = 0.95,
) -> StatResult:
    """Exact test of equal error rates: ``greater`` = the after rate is higher, ``less`` = it dropped."""
    _check_counts(errors_before, requests_before, "before")
    _check_counts(errors_after, requests_after, "after")
    k = errors_before + errors_after
    rate_before = errors_before / requests_before
    rate_after = errors_after / requests_after
    effect = rate_after / rate_before if rate_before else (math.inf if rate_after else 1.0)
    name = f"one-sided {CONDITIONAL_BINOMIAL}" if alternative != "two-sided" else CONDITIONAL_BINOMIAL
    if k == 0:
        return StatResult(name, alternative, 1.0, 0.0, None, effect)
    p = requests_after / (requests_before + requests_after)
    result = _stats().binomtest(errors_after, k, p, alternative=alternative)
    ci = _stats().binomtest(errors_after, k, p).proportion_ci(confidence_level=confidence, method="exact")
    interval = (_ratio(float(ci.low), requests_before, requests_after),
                _ratio(float(ci.high), requests_before, requests_after))  # fmt: skip
    return StatResult(name, alternative, float(result.pvalue), float(errors_after), interval, effect)


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
    result = _stats().poisson_means_test(errors_after, requests_after, errors_before, requests_before,
                                       alternative=alternative)  # fmt: skip
    rate_before = errors_before / requests_before
    rate_after = errors_after / requests_after
    effect = rate_after / rate_before if rate_before else (math.inf if rate_after else 1.0)
    p_value = float(result.pvalue)
    return StatResult(POISSON_E_TEST, alternative, min(max(p_value, 0.0), 1.0), float(result.statistic), None, effect)


def mann_whitney(before: Sequence[float], after: Sequence[float], alternative: Alternative = "greater") -> StatResult:
    """Rank test on latency samples: ``greater`` = after latencies are stochastically larger.

    ``effect`` is the common-language effect size P(after > before) + P(tie) / 2 = U / (n_after * n_before).
    """
    if not before or not after:
        raise ValueError("Mann-Whitney needs at least one sample on each side")
    result = _stats().mannwhitneyu(list(after), list(before), alternative=alternative, method="auto")
    u = float(result.statistic)
    p_value = float(result.pvalue)
    p_value = 1.0 if math.isnan(p_value) else p_value  # degenerate input: no evidence either way
    return StatResult(MANN_WHITNEY, alternative, p_value, u, None, u / (len(after) * len(before)))


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
    ci = _stats().binomtest(errors, requests).proportion_ci(confidence_level=confidence, method="exact")
    return (float(ci.low), float(ci.high))


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
