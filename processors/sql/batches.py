"""The rows of an ``executemany`` batch, from the parameters its span recorded.

A driver's ``executemany(sql, rows)`` is one span with one statement, whose parameters (when the instrumentation
records them: psycopg / psycopg2 / dbapi with ``capture_parameters=True``) are the whole list of rows, recorded as
its repr: ``[(50, 'd', 1), (51, 'e', 2)]`` or ``[{'id': 1}, {'id': 2}]``. Decoded, each row is one parameter, the
row's repr (``"(50, 'd', 1)"``), which must not be bound into the statement as a value (it would name the row
``accounts:(50, 'd', 1)``). When every parameter is such a row, of the statement's arity (a tuple of as many values
as the statement's highest ``$n``, or a dict for ``%(name)s`` placeholders), the span's accesses are those of the
statement run once per row. The rows are read with ``ast.literal_eval`` (never ``eval``); a row that holds anything
but plain values (numbers, strings, booleans, None) means the parameters are not read as a batch.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import replace
from typing import Final

from sqlglot import exp

from processors.model.events import Scalar
from processors.model.span import Span
from processors.sql.syntax import Pos, placeholder

Row = tuple[tuple[Scalar, ...], tuple[tuple[str, Scalar], ...]]  # (positional, named) parameters of one run

_OPENERS: Final = frozenset("([{")
_DB_AT: Final = Span.__match_args__.index("db")


def arity(tree: exp.Expression) -> int:
    """The number of positional parameters the statement takes: its highest ``$n`` (0 for none or names only)."""
    highest = 0
    for node in tree.walk():
        ref = placeholder(node) if isinstance(node, exp.Parameter | exp.Placeholder | exp.Column) else None
        if isinstance(ref, Pos):
            highest = max(highest, ref.index + 1)
    return highest


def batch_rows(params: tuple[Scalar, ...], positional: int) -> tuple[Row, ...] | None:
    """The rows of a batch, or None when ``params`` are one run's values. ``positional`` is the statement's arity:
    each row is a tuple of that many plain values, or (for a statement without ``$n``, ``positional == 0``) a dict."""
    if not params:
        return None
    rows: list[Row] = []
    for p in params:
        if not isinstance(p, str) or p[:1] not in _OPENERS:
            return None
        row = _row(p, positional)
        if row is None:
            return None
        rows.append(row)
    return tuple(rows)


def _row(text: str, positional: int) -> Row | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if positional and isinstance(value, tuple | list) and len(value) == positional and all(map(_plain, value)):
        return tuple(value), ()
    if (
        not positional
        and isinstance(value, dict)
        and value
        and all(isinstance(k, str) for k in value)
        and all(map(_plain, value.values()))
    ):
        return (), tuple(value.items())
    return None


def _plain(value: object) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def runs(span: Span, rows: tuple[Row, ...]) -> Iterator[Span]:
    """``span`` once per row, each with that row's parameters (what the statement ran with that time)."""
    db = span.db
    assert db is not None
    args = list(span.__reduce__()[1])
    for params, named in rows:
        args[_DB_AT] = replace(db, params=params, named_params=named)
        yield Span(*args)


__all__ = ["Row", "arity", "batch_rows", "runs"]
