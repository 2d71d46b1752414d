"""The rows of an executemany batch, read from its recorded parameters (and what is not a batch)."""

from __future__ import annotations

import pytest

from processors.model.events import Scalar
from processors.sql.batches import batch_rows


def test_tuples_of_the_statement_arity_are_rows() -> None:
    """Each parameter a row of as many plain values as the statement's highest ``$n``."""
    assert batch_rows(("(50, 'd', 1)", "[51, 'e', None]"), 3) == (((50, "d", 1), ()), ((51, "e", None), ()))


def test_dicts_are_rows_of_a_named_statement() -> None:
    """A statement with ``%(name)s`` placeholders only (arity 0): each row a dict."""
    assert batch_rows(('{"balance":11,"id":50}',), 0) == (((), (("balance", 11), ("id", 50))),)


@pytest.mark.parametrize(
    "params",
    [
        (1, 2, 3),  # one run's values
        ("(1, 2)", "(3, 4)", 5),  # not every parameter is a row
        ("(1, 2)", "(3, 4)"),  # rows of another arity than the statement's 3
        ("(1, (2, 3), 4)",),  # a row holding a tuple: not plain values
        ("(1, __import__('os'), 3)",),  # code is never evaluated
        ("(" * 100_000,),  # not a literal
        ("[1, 2, 3]x",),
        (),
    ],
)
def test_anything_else_is_one_run(params: tuple[Scalar, ...]) -> None:
    """Parameters that are not all rows of the statement's arity are one run's values (None)."""
    assert batch_rows(params, 3) is None


def test_a_string_value_of_a_named_statement_is_not_a_row() -> None:
    """A tuple repr is no row of a named statement, a dict repr no row of a positional one."""
    assert batch_rows(("(1, 2)",), 0) is None
    assert batch_rows(('{"a": 1}',), 1) is None
