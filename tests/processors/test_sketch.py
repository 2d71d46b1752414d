"""LatencySketch: log-bucketed quantiles with bounded relative error, mergeable."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from processors.lib.sketch import LatencySketch

latencies = st.floats(min_value=1e-3, max_value=3.6e6, allow_nan=False, allow_infinity=False)
samples = st.lists(latencies, min_size=1, max_size=300)
quantiles = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
GRID = [i / 100 for i in range(101)]


def exact(values: list[float], q: float) -> float:
    """The same (lower) rank the sketch reads: element floor(q * (n - 1)) of the sorted values."""
    return sorted(values)[math.floor(q * (len(values) - 1))]


def sketch_of(values: list[float]) -> LatencySketch:
    s = LatencySketch()
    for v in values:
        s.add(v)
    return s


@given(samples, quantiles)
def test_quantile_within_one_percent_of_exact(values: list[float], q: float) -> None:
    """Any quantile of random latencies is within 1% relative error of the exact order statistic."""
    s = sketch_of(values)
    want = exact(values, q)
    assert math.isclose(s.quantile(q), want, rel_tol=0.01), (q, want, s.quantile(q))


@given(samples)
def test_quantiles_stay_within_min_and_max(values: list[float]) -> None:
    """Quantiles never leave the observed range and are monotone in q."""
    s = sketch_of(values)
    got = [s.quantile(q) for q in GRID]
    assert all(min(values) <= g <= max(values) for g in got)
    assert got == sorted(got)
    assert s.count == len(values)


@given(samples, samples)
def test_merge_equals_adding_all(a: list[float], b: list[float]) -> None:
    """Merging two sketches gives the same sketch as adding all values to one."""
    left, right, both = sketch_of(a), sketch_of(b), sketch_of(a + b)
    left.merge(right)
    assert (left.count, left.min, left.max) == (both.count, both.min, both.max)
    assert [left.quantile(q) for q in GRID] == [both.quantile(q) for q in GRID]


def test_merge_with_empty_changes_nothing() -> None:
    """Merging an empty sketch in (or into an empty one) keeps the other's answers."""
    s = sketch_of([1.0, 2.0, 3.0])
    before = [s.quantile(q) for q in GRID]
    s.merge(LatencySketch())
    assert [s.quantile(q) for q in GRID] == before
    empty = LatencySketch()
    empty.merge(s)
    assert [empty.quantile(q) for q in GRID] == before
    assert (empty.count, empty.min, empty.max) == (3, 1.0, 3.0)


def test_empty_sketch_quantile_is_zero() -> None:
    """An empty sketch answers 0.0 for every quantile."""
    assert LatencySketch().quantile(0.5) == 0.0


def test_single_value_is_returned_exactly() -> None:
    """With one value every quantile is that value (clamped to min and max)."""
    s = sketch_of([12.345])
    assert [s.quantile(q) for q in (0.0, 0.5, 0.95, 1.0)] == [12.345] * 4


def test_sub_microsecond_values_are_clamped() -> None:
    """Durations below 1 µs (including zero and negative skew) count as 1 µs."""
    s = sketch_of([0.0, -3.0, 1e-9])
    assert s.quantile(0.5) == 1e-3
    assert s.count == 3
