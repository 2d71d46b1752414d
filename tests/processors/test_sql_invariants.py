"""Invariants (``collisions.invariants``, SQL predicates on after-images) over hostile row values.

The collision detector judges a row's after-images against its table's invariants in the middle of judging a step:
a value that raised there (``'NaN'``, Debezium's string decimal) lost the incidents already found in that step and
left the remaining rows' pins behind. Such a value is *unknown*: the invariant neither holds nor fails on it.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.lib.invariants import Invariant
from tests.fuzz.strategies import ROW_VALUES

NON_NUMBERS: list[Any] = [
    "NaN",
    "nan",
    "Infinity",
    "-Infinity",
    "sNaN",
    "-sNaN",
    math.nan,
    math.inf,
    -math.inf,
    Decimal("NaN"),
    Decimal("sNaN"),
    Decimal("Infinity"),
]


@pytest.mark.parametrize("value", NON_NUMBERS, ids=repr)
@pytest.mark.parametrize("text", ["stock >= 0", "stock < 0", "stock = 1", "NOT stock <> 1", "-stock <= 0"])
def test_a_value_that_is_not_a_number_is_unknown(text: str, value: Any) -> None:
    """``NaN``, ``Infinity`` and ``sNaN`` (as text, float or Decimal) make a comparison unknown: ``holds`` is None
    (it raised decimal.InvalidOperation, or judged Infinity a number)."""
    assert Invariant(text).holds({"stock": value}) is None


@pytest.mark.parametrize(
    ("text", "row", "expected"),
    [
        ("stock >= 0", {"stock": -1}, False),
        ("stock >= 0", {"stock": "5"}, True),
        ("stock >= 0", {"stock": "9" * 5_000}, True),
        ("stock >= 0", {"stock": None}, None),  # NULL: unknown, as a CHECK constraint passes it
        ("stock >= 0", {"stock": "abc"}, None),
        ("stock >= 0", {}, None),
        ("stock >= 0 OR sku = 'x'", {"stock": "NaN", "sku": "x"}, True),
        ("stock >= 0 AND sku = 'x'", {"stock": "NaN", "sku": "y"}, False),
        ("stock IS NULL", {"stock": "NaN"}, False),
        ("stock IS NOT NULL", {"stock": None}, False),
        ("stock IS NOT NULL", {"stock": 3}, True),  # IS NOT NULL was read as IS NULL
        ("stock >= 0 AND sku IS NOT NULL", {"stock": 1, "sku": "a"}, True),
        ("flag IS NOT TRUE", {"flag": True}, False),
    ],
)
def test_three_valued_logic(text: str, row: dict[str, Any], expected: bool | None) -> None:
    """AND, OR, NOT and IS [NOT] NULL follow SQL's three-valued logic; only False is a violation."""
    assert Invariant(text).holds(row) is expected


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.sampled_from(
        ["stock >= 0", "stock < amount OR NOT stock = 1", "-stock <= amount AND stock IS NOT NULL", "stock = 'x'"]
    ),
    st.dictionaries(
        st.sampled_from(["stock", "amount"]),
        st.sampled_from(ROW_VALUES) | st.integers() | st.floats() | st.text(max_size=5),
        max_size=2,
    ),
)
def test_invariants_never_raise(text: str, row: dict[str, Any]) -> None:
    """Over hostile row values (numbers at and past their edges, text, structs, nesting) an invariant is True,
    False or None, never an exception."""
    assert Invariant(text).holds(row) in (True, False, None)
