"""Exact tests, rank test, traffic floors and FDR control against known answers."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from processors.lib.stat_tests import (
    benjamini_hochberg,
    binomial_tail,
    conditional_binomial,
    errors_needed,
    mann_whitney,
    poisson_e_test,
    proportion_interval,
    rate_interval,
    requests_to_show_drop,
    zero_error_upper_bound,
)
from processors.model.units import zero_error_floor


def test_forty_errors_before_none_after_is_a_significant_drop() -> None:
    """40/10,000 before vs 0/1,000 after: P(X=0 | n=40, p=1/11) = (10/11)**40 ~ 0.0221."""
    r = conditional_binomial(40, 10_000, 0, 1_000, "less")
    assert math.isclose(r.p_value, (10 / 11) ** 40, rel_tol=1e-9)
    assert round(r.p_value, 4) == 0.0221
    assert r.effect == 0.0
    assert r.interval is not None and r.interval[0] == 0.0 and r.interval[1] < 1.0


def test_three_errors_vs_none_at_equal_traffic_is_not_significant() -> None:
    """3 vs 0 errors at equal traffic: p = (1/2)**3 = 0.125, no evidence of a drop."""
    r = conditional_binomial(3, 1_000, 0, 1_000, "less")
    assert r.p_value == pytest.approx(0.125)
    assert r.p_value > 0.05


def test_increase_direction_and_no_errors_at_all() -> None:
    """'greater' is the upper tail; with no error on either side there is nothing to test (p = 1)."""
    r = conditional_binomial(0, 400, 12, 400, "greater")
    assert r.p_value == pytest.approx(0.5**12)
    assert r.effect == math.inf
    assert conditional_binomial(0, 100, 0, 100, "greater").p_value == 1.0
    with pytest.raises(ValueError, match="requests"):
        conditional_binomial(1, 0, 0, 10)


def test_rate_ratio_interval_is_the_exact_binomial_interval_rescaled() -> None:
    """The CI of the rate ratio comes from the Clopper-Pearson CI of the after share of the errors."""
    r = conditional_binomial(10, 1_000, 30, 1_000, "greater")
    ci = stats.binomtest(30, 40, 0.5).proportion_ci(0.95, method="exact")
    assert r.interval is not None
    assert r.interval == pytest.approx((ci.low / (1 - ci.low), ci.high / (1 - ci.high)))
    assert r.interval[0] < 3.0 < r.interval[1]


def test_poisson_e_test_agrees_on_direction() -> None:
    """The E-test on the same counts also finds the drop, and finds no increase."""
    assert poisson_e_test(40, 10_000, 0, 1_000, "less").p_value < 0.05
    assert poisson_e_test(40, 10_000, 0, 1_000, "greater").p_value > 0.5


def test_zero_error_rule_numbers() -> None:
    """n >= ln(alpha) / ln(1 - p0): 1% -> 299, 3% -> 99, 5% -> 59, 0.4% -> 748; the bound at n is below p0."""
    assert [zero_error_floor(p) for p in (0.01, 0.03, 0.05, 0.004)] == [299, 99, 59, 748]
    assert zero_error_floor(0.01, alpha=0.01) == 459
    assert zero_error_floor(1.0) == 1
    assert zero_error_upper_bound(299) < 0.01 < zero_error_upper_bound(298)
    assert rate_interval(0, 299) == (0.0, zero_error_upper_bound(299))
    with pytest.raises(ValueError):
        zero_error_floor(0.0)


def test_requests_to_show_a_drop_and_errors_needed() -> None:
    """40 errors in 10,000 need 778 clean requests for p <= 0.05; at a 1:1 split 5 errors are the minimum."""
    n = requests_to_show_drop(40, 10_000)
    assert n == 778
    assert conditional_binomial(40, 10_000, 0, n, "less").p_value <= 0.05
    assert conditional_binomial(40, 10_000, 0, n - 1, "less").p_value > 0.05
    assert requests_to_show_drop(0, 10_000) is None
    assert errors_needed(0.5) == 5 and 0.5**5 <= 0.05 < 0.5**4


def test_benjamini_hochberg_known_values() -> None:
    """Adjusted p-values of a textbook example, and the same as scipy's false_discovery_control."""
    p = [0.01, 0.04, 0.03, 0.005]
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    rng = random.Random(7)
    many = [rng.random() ** 3 for _ in range(50)]
    assert benjamini_hochberg(many) == pytest.approx(list(stats.false_discovery_control(many)))
    assert benjamini_hochberg([]) == []


def test_mann_whitney_finds_a_shift_and_not_its_absence() -> None:
    """A 5 ms shift of 50 samples is found one-sided; identical distributions are not; effect = P(after > before)."""
    rng = random.Random(1)
    before = [10 + rng.gauss(0, 1) for _ in range(50)]
    shifted = [x + 5 for x in before]
    r = mann_whitney(before, shifted, "greater")
    assert r.p_value < 1e-10 and r.effect == pytest.approx(1.0, abs=0.01)
    same = [10 + rng.gauss(0, 1) for _ in range(50)]
    assert mann_whitney(before, same, "greater").p_value > 0.01
    assert mann_whitney(shifted, before, "greater").p_value > 0.99


# ---- the same numbers as scipy.stats (the tests are computed from scipy.special; see processors.lib.stat_tests)
# -------

EXAMPLES = settings(max_examples=300, deadline=None, derandomize=True, database=None)


@st.composite
def binomial_cases(draw: st.DrawFn) -> tuple[int, int, float]:
    n = draw(st.integers(1, 5_000))
    return draw(st.integers(0, n)), n, draw(st.floats(0.0005, 0.9995))


@EXAMPLES
@given(binomial_cases(), st.sampled_from(["greater", "less"]))
def test_binomial_tail_is_scipy_binomtest(case: tuple[int, int, float], alternative: str) -> None:
    k, n, p = case
    expected = stats.binomtest(k, n, p, alternative=alternative).pvalue
    assert binomial_tail(k, n, p, alternative) == pytest.approx(expected, rel=1e-9, abs=1e-300)  # type: ignore[arg-type]


@EXAMPLES
@given(binomial_cases(), st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_proportion_interval_is_scipy_exact_interval(case: tuple[int, int, float], confidence: float) -> None:
    """Closed form (inverse regularised beta) against scipy's root search, which stops within 2e-12."""
    k, n, _ = case
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    assert proportion_interval(k, n, confidence) == pytest.approx((ci.low, ci.high), rel=1e-8, abs=1e-11)


samples = st.one_of(  # tied integers (the asymptotic test with its tie term), distinct floats (exact when small)
    st.lists(st.integers(0, 6), min_size=1, max_size=40),
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=12, unique=True),
    st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=300),
)


@EXAMPLES
@given(samples, samples, st.sampled_from(["greater", "less", "two-sided"]))
def test_mann_whitney_is_scipy_mannwhitneyu(before: list[float], after: list[float], alternative: str) -> None:
    """Ranks, tie term, exact distribution of U (a side of at most 8, no ties) and normal approximation: scipy's."""
    expected = stats.mannwhitneyu(after, before, alternative=alternative, method="auto")
    r = mann_whitney(before, after, alternative)  # type: ignore[arg-type]
    assert r.statistic == pytest.approx(float(expected.statistic), rel=1e-12)
    p = float(expected.pvalue)
    assert r.p_value == pytest.approx(1.0 if math.isnan(p) else p, rel=1e-9, abs=1e-15)


def test_mann_whitney_exact_distribution_known_values() -> None:
    """Mann and Whitney's table: n1 = 3, n2 = 4, P(U <= 1) = 2/35; the two-sided textbook example (p = 0.1111)."""
    r = mann_whitney([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 1.5], "less")  # after ranks 1, 2, 4: U1 = 1
    assert r.statistic == 1.0 and r.p_value == pytest.approx(2 / 35, rel=1e-12)
    males, females = [19.0, 22, 16, 29, 24], [20.0, 11, 17, 12]
    assert mann_whitney(females, males, "two-sided").p_value == pytest.approx(1 / 9, rel=1e-12)
    assert mann_whitney([5.0] * 30, [5.0] * 30, "greater").p_value == 1.0  # all tied: no evidence


@pytest.mark.parametrize("small", [1, 7, 8, 9])
def test_mann_whitney_switches_to_the_normal_approximation_where_scipy_does(small: int) -> None:
    """Exact while a side has at most 8 samples (and nothing is tied), asymptotic from 9 on both sides."""
    rng = random.Random(small)
    before, after = [rng.random() for _ in range(small)], [rng.random() + 0.2 for _ in range(25)]
    for x, y in ((before, after), (after, before)):
        expected = stats.mannwhitneyu(y, x, alternative="greater", method="auto").pvalue
        assert mann_whitney(x, y, "greater").p_value == pytest.approx(expected, rel=1e-9)
