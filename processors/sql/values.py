"""Values as spans and Debezium give them, compared; and WHERE predicates evaluated on row images.

A span's parameters are ``str()`` of the driver's tuple (parsed back to scalars); Debezium's images are JSON
(numbers, strings, booleans; numerics and dates per the connector's converters). Two values compare when they
are of one kind after normalising (null, bool, number, text); otherwise the answer is *unknown* (None), never a
guess. A predicate access carries its whole WHERE as a tree (``processors.sql.predicate``), which decides whether
it covers an image as PostgreSQL would, or says it cannot; without one, a predicate covers an image when every term
holds, does not when one term fails, and is unknown when a term cannot be decided or the WHERE had terms the
extractor could not read (``exact`` is False).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from processors.model.events import Predicate
from processors.sql.pgsemantics import UNAVAILABLE, Undecidable
from processors.sql.predicate import evaluate
from processors.sql.predicate_text import where_text

_TRUE: Final = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE: Final = frozenset({"f", "false", "n", "no", "off", "0"})


def normalised(value: Any) -> tuple[str, Any] | None:
    """(kind, value) with kind in null/bool/num/str; None when the value cannot be compared."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | Decimal | float):
        d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        return ("num", d) if d.is_finite() else ("str", str(value))
    if isinstance(value, str):
        if value == UNAVAILABLE:
            return None
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            return ("str", value)
        return ("num", d) if d.is_finite() else ("str", value)
    return None


def _as_bool(kind: str, value: Any) -> bool | None:
    if kind == "bool":
        return bool(value)
    if kind == "num" and value in (0, 1):
        return bool(value)
    if kind == "str" and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def compare(bound: Any, stored: Any) -> int | None:
    """-1, 0 or 1 as ``stored`` is below, equal to or above ``bound``; None when they do not compare
    (different kinds, NULLs: SQL's comparisons with NULL are never true)."""
    a, b = normalised(bound), normalised(stored)
    if a is None or b is None or a[0] == "null" or b[0] == "null":
        return None
    if "bool" in (a[0], b[0]):
        x, y = _as_bool(*a), _as_bool(*b)
        return None if x is None or y is None else int(y) - int(x)
    if a[0] != b[0]:
        return None  # e.g. a timestamp string against Debezium's epoch number
    return int(b[1] > a[1]) - int(b[1] < a[1])


def same_value(bound: Any, stored: Any) -> bool | None:
    """Whether a bound parameter equals a stored column value; None when they are not comparable."""
    a, b = normalised(bound), normalised(stored)
    if a is None or b is None:
        return None
    if a[0] == "null" or b[0] == "null":
        return a[0] == b[0]
    c = compare(bound, stored)
    return None if c is None else c == 0


_HOLDS: Final = {
    "=": lambda c: c == 0,
    "<>": lambda c: c != 0,
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}

Term = tuple[str, str, Any]  # (column, operator, bound value); IN's value is a tuple of values


def term_holds(term: Term, image: Mapping[str, Any]) -> bool | None:
    """Whether ``column op value`` holds on the row image; None when it cannot be decided."""
    column, op, value = term
    if column not in image:
        return None
    stored = image[column]
    if op in ("IS", "IS NOT"):
        if value is None:
            return (stored is None) == (op == "IS")
        same = same_value(value, stored)  # IS TRUE / IS FALSE
        return None if same is None else same == (op == "IS")
    if op == "IN":
        answers = [same_value(v, stored) for v in value]
        if any(a is True for a in answers):
            return True
        return False if all(a is False for a in answers) else None
    if stored is None:
        return False  # a comparison with NULL is never true
    c = compare(value, stored)
    holds = _HOLDS.get(op)
    return None if c is None or holds is None else holds(c)


def covers(terms: Sequence[Term], exact: bool, image: Mapping[str, Any] | None, where: Predicate | None = None,
           undecided: Callable[[str], None] | None = None) -> bool | None:  # fmt: skip
    """Whether a WHERE selects the row image: its whole tree (``where``) when the statement has one, else the
    conjunction of ``terms`` (``exact`` when they are all of it). None when that cannot be decided (the tree's
    reason then goes to ``undecided``, to be counted)."""
    if image is None:
        return False
    if where is not None:
        truth = evaluate(where, image)
        if isinstance(truth, Undecidable):
            if undecided is not None:
                undecided(truth.reason)
            return None
        return truth is True  # NULL, like FALSE, does not select
    unknown = not exact
    for term in terms:
        holds = term_holds(term, image)
        if holds is False:
            return False
        unknown |= holds is None
    return None if unknown else True


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float | Decimal):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def predicate_text(terms: Sequence[Term], exact: bool, where: Predicate | None = None) -> str:
    """A predicate for people: ``room = 5 AND day = '2026-12-01'`` (``… AND ?`` when terms could not be read); the
    whole WHERE (``value % 3 = 0``) when the statement's tree is known."""
    if where is not None:
        return where_text(where)
    parts = []
    for column, op, value in terms:
        if op == "IN":
            parts.append(f"{column} IN ({', '.join(_literal(v) for v in value)})")
        else:
            parts.append(f"{column} {op} {_literal(value)}")
    if not exact:
        parts.append("…")
    return " AND ".join(parts) or "TRUE"


__all__ = ["UNAVAILABLE", "Term", "compare", "covers", "normalised", "predicate_text", "same_value", "term_holds"]
