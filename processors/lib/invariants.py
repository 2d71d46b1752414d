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


class _Unknown:
    """A value that compares with nothing: not a number although it looks like one (``NaN``, ``Infinity``)."""

    __slots__ = ()


UNKNOWN = _Unknown()


def _num(value: Any) -> Any:
    """A row or literal value as the interpreter compares it: NULL as None, numbers (and numeric text) as finite
    ``Decimal``; ``NaN``, ``Infinity`` and ``sNaN`` (Debezium's string decimals can be any of them; a float may be)
    are ``UNKNOWN``, as are numbers whose text Python will not read."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        value = repr(value)  # the float's shortest text, as before (``nan`` and ``inf`` are read as such)
    if isinstance(value, int | Decimal | str):
        try:
            d = Decimal(value)  # an int needs no text: no int-string limit
        except (InvalidOperation, ValueError):
            return value  # text: compares with text only
        return d if d.is_finite() else UNKNOWN
    return value


class Invariant:
    """One predicate over a row image, in SQL's three-valued logic: ``holds(row)`` is True, False, or None when it
    cannot be decided (the row lacks a column it needs, a NULL, a value that is not a number, text against a
    number): only False is a violation, as for a ``CHECK`` constraint."""

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
            value = self._eval(self._tree, row)
        except KeyError:
            return None
        return value if isinstance(value, bool) else None

    def _truth(self, node: Any, row: Mapping[str, Any]) -> bool | None:
        value = self._eval(node, row)
        return value if isinstance(value, bool) else None

    def _eval(self, node: Any, row: Mapping[str, Any]) -> Any:  # sqlglot nodes
        if isinstance(node, exp.Paren):
            return self._eval(node.this, row)
        if isinstance(node, exp.And):
            left, right = self._truth(node.left, row), self._truth(node.right, row)
            return False if False in (left, right) else None if None in (left, right) else True
        if isinstance(node, exp.Or):
            left, right = self._truth(node.left, row), self._truth(node.right, row)
            return True if True in (left, right) else None if None in (left, right) else False
        if isinstance(node, exp.Not):
            truth = self._truth(node.this, row)
            return None if truth is None else not truth
        if isinstance(node, exp.Is):  # IS [NOT] NULL, IS [NOT] TRUE / FALSE: never unknown
            value = self._eval(node.this, row)
            is_ = value is node.expression.this if isinstance(node.expression, exp.Boolean) else value is None
            return is_ != bool(node.args.get("negate"))
        if isinstance(node, exp.Column):
            return _num(row[node.name])
        if isinstance(node, exp.Literal):
            return _num(node.this) if not node.is_string else node.this
        if isinstance(node, exp.Boolean):
            return node.this
        if isinstance(node, exp.Null):
            return None
        if isinstance(node, exp.Neg):
            value = self._eval(node.this, row)
            return value.copy_negate() if isinstance(value, Decimal) else UNKNOWN if value is not None else None
        compare = _COMPARE.get(type(node))
        if compare is not None:
            left, right = self._eval(node.left, row), self._eval(node.right, row)
            if left is None or right is None or left is UNKNOWN or right is UNKNOWN:
                return None
            if isinstance(left, str) != isinstance(right, str):
                return None  # text against a number (or a boolean): the invariant does not apply to this row
            try:
                return compare(left, right)
            except TypeError:  # other mixed kinds
                return None
        raise InvariantError(f"invariant {self.text!r}: unsupported {type(node).__name__}")


def compile_invariants(config: Mapping[str, list[str]]) -> dict[str, list[Invariant]]:
    """``{table: ["stock >= 0", ...]}`` → parsed invariants; raises InvariantError naming the bad one."""
    return {table: [Invariant(text) for text in texts] for table, texts in config.items()}
