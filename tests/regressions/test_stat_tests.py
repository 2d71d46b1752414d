"""Exact tests, rank test, traffic floors and FDR control against known answers."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from processors.model.units import zero_error_floor
from processors.stat_tests import (
    benjamini_hochberg,
    conditional_binomial,
    errors_needed,
    mann_whitney,
    poisson_e_test,
    rate_interval,
    requests_to_show_drop,
    zero_error_upper_bound,
)


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
    r = conditional_binomial(10, 1_000, 30, 1_000, "two-sided")
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
