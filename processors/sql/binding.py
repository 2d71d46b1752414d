"""Binding a span's parameters into a statement's cached shape: the WHERE terms and the SET/VALUES columns.

A value the span does not carry (stock instrumentation records no parameters) is left out, and the terms are then
marked inexact: what is left is still true of every row the statement touched, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from processors.model.events import Scalar
from processors.sql.syntax import Expr, Ref, Unbound, bind

Term = tuple[str, str, Ref | tuple[Ref, ...]]  # (column, operator, reference); IN's is a tuple of references


def columns_of(sets: Sequence[tuple[str, Ref]]) -> tuple[str, ...]:
    """The columns of a statement's SET (or INSERT's column list), whether or not their values are bound."""
    return tuple(column for column, _ in sets)


def bind_terms(terms: Sequence[Term], params: tuple[Scalar, ...], named: Mapping[str, Scalar]
               ) -> tuple[tuple[tuple[str, str, Any], ...], bool, tuple[tuple[str, str], ...]]:  # fmt: skip
    """The WHERE terms with the span's parameters bound; False when one could not be bound (dropped); and
    (column, operator) of the terms whose values the span does not carry (one of an IN list's is enough)."""
    out: list[tuple[str, str, Any]] = []
    unbound: list[tuple[str, str]] = []
    exact = True
    for column, op, ref in terms:
        if isinstance(ref, tuple):
            values = [bind(r, params, named) for r in ref]
            if any(isinstance(v, Unbound) for v in values):
                exact = False
                unbound.append((column, op))
                continue
            out.append((column, op, tuple(values)))
        elif isinstance(v := bind(ref, params, named), Unbound):
            exact = False
            unbound.append((column, op))
        elif isinstance(ref, Expr):
            exact = False  # an expression is SQL text, not a value a row image can be compared with
            out.append((column, op, v))  # kept for the record (keyed accesses' guards)
        else:
            out.append((column, op, v))
    return tuple(out), exact, tuple(unbound)


def bind_sets(sets: Sequence[tuple[str, Ref]], params: tuple[Scalar, ...],
              named: Mapping[str, Scalar]) -> tuple[tuple[tuple[str, Scalar], ...], tuple[str, ...]]:  # fmt: skip
    """The SET/VALUES columns whose values are bound, and those of them that are SQL expressions (``x - 1``)."""
    values, exprs = [], []
    for column, ref in sets:
        v = bind(ref, params, named)
        if not isinstance(v, Unbound):
            values.append((column, v))
            if isinstance(ref, Expr):
                exprs.append(column)
    return tuple(values), tuple(exprs)
