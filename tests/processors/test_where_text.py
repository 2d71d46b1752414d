"""predicate_text.where_text: the short way for comparisons of a column with a parameter writes the walk's text."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from processors.sql.predicate_text import _Writer, where_text

VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4), st.just("it's"))
BOXES = st.lists(st.one_of(st.tuples(VALUES), st.lists(VALUES, max_size=2), st.tuples(VALUES, VALUES)), max_size=3)
COMPARISONS = st.builds(
    lambda op, column, index: ("cmp", op, ("col", column), ("$", index)),
    st.sampled_from(["=", ">=", "<>"]),
    st.sampled_from(["id", "stock", 7]),
    st.one_of(st.integers(-1, 3), st.just("0")),
)
OTHERS = st.sampled_from(
    [
        ("cmp", "=", ("col", "id"), ("int", 5)),
        ["cmp", "=", ["col", "id"], ["$", 0]],
        ("cmp", "=", ("$", 0), ("col", "id")),
        ("cmp", "=", ("col", "id")),
        ("col", "x"),
        ("or", ("cmp", "=", ("col", "a"), ("$", 0))),
    ]
)
TREES = st.one_of(
    COMPARISONS, OTHERS, st.lists(st.one_of(COMPARISONS, OTHERS), max_size=3).map(lambda terms: ("and", *terms))
)


@given(TREES, BOXES)
def test_where_text_is_the_writers_text(tree: Any, boxes: list[Any]) -> None:
    """Comparisons of a column with a parameter and ANDs of them, alone or among other terms, with parameters
    missing, malformed or of any kind, read as the general writer writes them."""
    assert where_text((tree, tuple(boxes))) == _Writer(tuple(boxes)).sql(tree, 0)


def test_comparisons_read_as_sql() -> None:
    tree = ("and", ("cmp", "=", ("col", "id"), ("$", 0)), ("cmp", ">=", ("col", "stock"), ("$", 1)))
    assert where_text((tree, ((5,), ("it's",)))) == "id = 5 AND stock >= 'it''s'"
