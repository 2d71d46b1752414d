"""Invariants on row after-images, declared in config as SQL predicates (``inventory: stock >= 0``).

Parsed once with sqlglot and evaluated by a small interpreter over comparisons, AND/OR/NOT, IS NULL and literals:
the predicate is configuration, the row is production data, and neither is ever ``eval``-ed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import sqlglot
from sqlglot import exp

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}


class InvariantError(ValueError):
    """An invariant that cannot be parsed or uses an unsupported construct."""


def _num(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float | Decimal):
        return Decimal(str(value))
    if isinstance(value, str):
        try:
            return Decimal(value)
        except InvalidOperation:
            return value
    return value


class Invariant:
    """One predicate over a row image; ``holds(row)`` is None when the row lacks a column it needs."""

    __slots__ = ("_tree", "columns", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            self._tree = sqlglot.parse_one(text, dialect="postgres")
        except sqlglot.errors.ParseError as exc:
            raise InvariantError(f"invariant {text!r}: {exc}") from exc
        self.columns = sorted({c.name for c in self._tree.find_all(exp.Column)})
        self._check(self._tree)

    def _check(self, node: Any) -> None:
        allowed = (exp.And, exp.Or, exp.Not, exp.Paren, exp.Is, exp.Null, exp.Column, exp.Literal, exp.Boolean,
                   exp.Neg, exp.Identifier, *_COMPARE)  # fmt: skip
        for n in node.walk():
            if not isinstance(n, allowed):
                raise InvariantError(f"invariant {self.text!r}: unsupported {type(n).__name__}")

    def holds(self, row: Mapping[str, Any]) -> bool | None:
        try:
            return bool(self._eval(self._tree, row))
        except KeyError:
            return None
        except TypeError:  # comparing text with a number: the invariant does not apply to this row
            return None

    def _eval(self, node: Any, row: Mapping[str, Any]) -> Any:  # sqlglot nodes
        if isinstance(node, exp.Paren):
            return self._eval(node.this, row)
        if isinstance(node, exp.And):
            return self._eval(node.left, row) and self._eval(node.right, row)
        if isinstance(node, exp.Or):
            return self._eval(node.left, row) or self._eval(node.right, row)
        if isinstance(node, exp.Not):
            return not self._eval(node.this, row)
        if isinstance(node, exp.Is):
            return self._eval(node.this, row) is None
        if isinstance(node, exp.Column):
            return _num(row[node.name])
        if isinstance(node, exp.Literal):
            return _num(node.this) if not node.is_string else node.this
        if isinstance(node, exp.Boolean):
            return node.this
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Neg):
            return -self._eval(node.this, row)
        compare = _COMPARE.get(type(node))
        if compare is not None:
            left, right = self._eval(node.left, row), self._eval(node.right, row)
            if left is None or right is None:
                return None
            return compare(left, right)
        raise InvariantError(f"invariant {self.text!r}: unsupported {type(node).__name__}")


def compile_invariants(config: Mapping[str, list[str]]) -> dict[str, list[Invariant]]:
    """``{table: ["stock >= 0", ...]}`` → parsed invariants; raises InvariantError naming the bad one."""
    return {table: [Invariant(text) for text in texts] for table, texts in config.items()}
