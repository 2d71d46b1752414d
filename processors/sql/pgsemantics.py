"""PostgreSQL's semantics for the values a WHERE predicate computes on a Debezium row image, or *undecidable*.

Values here are ``None`` (SQL NULL), ``bool``, ``int`` (an integer type), ``Decimal`` (numeric), ``float``
(double precision), ``str`` and naive ``datetime``, or an :class:`Undecidable` with its reason. A Debezium image
does not say a column's type: a string may be text, a numeric (``decimal.handling.mode=string``) or a timestamp
(``ZonedTimestamp``); an integer may be a number or a date as epoch days or micros. So a comparison of two strings
is made under every reading both strings allow (text; numeric when both are numbers; timestamp when both are ISO
timestamps) and decided only when the readings agree. Text is ordered by the database's collation, which is not
known: only strings whose order is the same under every common collation are ordered. Where PostgreSQL would raise
an error (division by zero, an overflow) or depends on the session (time zone, locale), the answer is undecidable.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from decimal import ROUND_HALF_UP, Context, Decimal, Inexact, InvalidOperation
from typing import Any, Final


class Undecidable:
    """A value (or truth) the evaluator cannot tell from the image; ``reason`` says why (a counter's label)."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __repr__(self) -> str:
        return f"Undecidable({self.reason!r})"


UNAVAILABLE: Final = "__debezium_unavailable_value"  # Debezium's placeholder for unchanged TOAST columns
Value = Any  # None | bool | int | Decimal | float | str | datetime | Undecidable

_TRUE: Final = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE: Final = frozenset({"f", "false", "n", "no", "off", "0"})
_INT_TEXT: Final = re.compile(r"\s*[+-]?[0-9]+\s*")
_NUM_TEXT: Final = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*")
_TEMPORAL: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_SAFE_TEXT: Final = (re.compile(r"[a-z0-9]*"), re.compile(r"[A-Z0-9]*"))
_INT8: Final = 2**63
_NUMERIC_DIGITS: Final = 16  # a numeric quotient has at least this many significant digits, then is rounded
_CTX: Final = Context(prec=400, Emax=10**6, Emin=-(10**6), traps=[InvalidOperation])
LIKE_MAX_STEPS: Final = 10**7  # a LIKE whose match could take more steps is undecidable, not a stalled stage
TRUNC_UNITS: Final = ("year", "quarter", "month", "week", "day", "hour", "minute", "second")


def undecidable(*values: Value) -> Undecidable | None:
    for v in values:
        if type(v) is Undecidable:
            return v
    return None


def of_image(value: Any) -> Value:
    """A row image's JSON value as a value here (arrays, objects and TOAST placeholders are undecidable)."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else Undecidable("type")  # NaN and infinities order apart in SQL
    if isinstance(value, str):
        return Undecidable("toast_unavailable") if value == UNAVAILABLE else value
    return Undecidable("type")


def truth(value: Value) -> bool | Undecidable | None:
    """A value in a boolean position (``WHERE flag``, ``AND``'s operands)."""
    if value is None or isinstance(value, bool | Undecidable):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return Undecidable("not_boolean")


def _number(value: Value) -> int | Decimal | float | None:
    """A number, or a string that reads as one (Debezium's numerics as strings, an untyped parameter)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int | Decimal):
        return value
    if isinstance(value, str) and _NUM_TEXT.fullmatch(value):
        d = Decimal(value.strip())
        return d if d.is_finite() else None
    return None


def _double(x: int | Decimal | float) -> float | None:
    """``x`` as a double precision, None past its range (PostgreSQL: value out of range)."""
    try:
        f = float(x)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def _timestamp(value: Value) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str) and _TEMPORAL.match(value.strip()):
        try:
            return datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    return None


def _order(a: Any, b: Any) -> int:
    return int(a > b) - int(a < b)


def _text_order(a: str, b: str) -> int | None:
    """Codepoint order where every common collation agrees with it (else None): equal strings; strings of only
    lower-case (or only upper-case) ASCII letters and digits; strings of one layout differing only in digits."""
    if a == b:
        return 0
    if any(p.fullmatch(a) and p.fullmatch(b) for p in _SAFE_TEXT):
        return _order(a, b)
    if len(a) == len(b) and all(x == y or (x.isascii() and y.isascii() and x.isdigit() and y.isdigit())
                                for x, y in zip(a, b, strict=True)):  # fmt: skip
        return _order(a, b)
    return None


def compare(a: Value, b: Value, *, equality: bool = False) -> int | Undecidable | None:
    """-1, 0 or 1 as ``a`` is below, equal to or above ``b``; None when one is NULL. With ``equality`` only whether
    they are equal counts (0, else 1): text is equal or not under every deterministic collation."""
    if (u := undecidable(a, b)) is not None:
        return u
    if a is None or b is None:
        return None
    if isinstance(a, bool) or isinstance(b, bool):
        p, q = truth(a), truth(b)  # a boolean against a boolean or its text ('t', 'false', ...); no number
        if (
            not isinstance(p, bool)
            or not isinstance(q, bool)
            or not isinstance(b if isinstance(a, bool) else a, bool | str)
        ):
            return Undecidable("type")
        return _order(p, q)
    if isinstance(a, str) and isinstance(b, str):
        readings = [int(a != b) if equality else _text_order(a, b)]
        x, y = _number(a), _number(b)
        if x is not None and y is not None:
            readings.append(_order(x, y))
        s, t = _timestamp(a), _timestamp(b)
        if s is not None and t is not None:
            readings.append(_order(s, t) if (s.tzinfo is None) == (t.tzinfo is None) else None)
        if equality:
            readings = [None if r is None else int(r != 0) for r in readings]
        return readings[0] if readings[0] is not None and len(set(readings)) == 1 else Undecidable("ambiguous_text")
    if isinstance(a, datetime) or isinstance(b, datetime):
        s, t = _timestamp(a), _timestamp(b)
        if s is None or t is None or (s.tzinfo is None) != (t.tzinfo is None):
            return Undecidable("temporal")
        return _order(s, t)
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return Undecidable("type")  # e.g. an ISO timestamp against Debezium's epoch number
    if isinstance(x, float) or isinstance(y, float):
        fx, fy = _double(x), _double(y)  # PostgreSQL compares a double with a numeric as doubles
        return Undecidable("overflow") if fx is None or fy is None else _order(fx, fy)
    return _order(x, y)


_HOLDS: Final = {"=": (0,), "<>": (-1, 1), "<": (-1,), "<=": (-1, 0), ">": (1,), ">=": (0, 1)}


def holds(op: str, a: Value, b: Value) -> bool | Undecidable | None:
    c = compare(a, b, equality=op in ("=", "<>"))
    if c is None or isinstance(c, Undecidable):
        return c
    found = _HOLDS.get(op)
    return Undecidable("malformed") if found is None else c in found


def arith(op: str, a: Value, b: Value) -> Value:
    """``a op b`` for + - * / % (integer division truncates toward zero, ``%`` takes the dividend's sign)."""
    if (u := undecidable(a, b)) is not None:
        return u
    if a is None or b is None:
        return None
    x, y = _number(a), _number(b)
    if x is None or y is None:
        return Undecidable("type")
    if isinstance(x, float) or isinstance(y, float):
        if op == "%":
            return Undecidable("type")  # PostgreSQL has no % for double precision
        fx, fy = _double(x), _double(y)
        if fx is None or fy is None:
            return Undecidable("overflow")
        if op == "/" and fy == 0:
            return Undecidable("division_by_zero")
        f = fx + fy if op == "+" else fx - fy if op == "-" else fx * fy if op == "*" else fx / fy
        return f if math.isfinite(f) else Undecidable("overflow")
    if op in "/%" and y == 0:
        return Undecidable("division_by_zero")
    if isinstance(x, int) and isinstance(y, int):
        if op in "/%":
            q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
            r: int = q if op == "/" else x - y * q
        else:
            r = x + y if op == "+" else x - y if op == "-" else x * y
        return r if -_INT8 <= r < _INT8 else Undecidable("overflow")
    ctx = _CTX.copy()
    dx, dy = Decimal(x), Decimal(y)
    try:
        if op == "/":
            # numeric division rounds to a scale PostgreSQL chooses: decided only when the quotient is exact (and,
            # a string operand possibly being an integer parameter, when integer division would give the same)
            d = ctx.divide(dx, dy)
            if (
                ctx.flags[Inexact]
                or len(ctx.normalize(d).as_tuple().digits) > _NUMERIC_DIGITS
                or (d != d.to_integral_value() and _maybe_integers(a, b))
            ):
                return Undecidable("inexact_division")
            return d
        funcs = {"+": ctx.add, "-": ctx.subtract, "*": ctx.multiply, "%": ctx.remainder}
        d = funcs[op](dx, dy)
    except (InvalidOperation, KeyError):
        return Undecidable("malformed")
    return Undecidable("overflow") if ctx.flags[Inexact] else d


def _maybe_integers(*operands: Value) -> bool:
    """Whether every operand may be of an integer type: an int, or text in integer syntax (a parameter, which
    PostgreSQL types after the other operand)."""
    return all(isinstance(o, int) or (isinstance(o, str) and _INT_TEXT.fullmatch(o)) for o in operands)


def negate(a: Value) -> Value:
    if a is None or isinstance(a, Undecidable):
        return a
    x = _number(a)
    if x is None:
        return Undecidable("type")
    return x.copy_negate() if isinstance(x, Decimal) else -x  # exact: no context to overflow


def like(value: Value, pattern: Value, escape: Value, fold: bool) -> bool | Undecidable | None:
    """``value [I]LIKE pattern [ESCAPE escape]``, matched without regular expressions (linear in practice)."""
    if (u := undecidable(value, pattern, escape)) is not None:
        return u
    if value is None or pattern is None or escape is None:
        return None
    if not isinstance(value, str) or not isinstance(pattern, str) or not isinstance(escape, str) or len(escape) > 1:
        return Undecidable("type")
    if fold:
        if not (value.isascii() and pattern.isascii()):
            return Undecidable("locale")  # ILIKE folds case by the database's locale
        value, pattern = value.lower(), pattern.lower()
    tokens: list[str | None] = []  # a character, "%" as None, "_" as ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape and c == escape:
            if i + 1 == len(pattern):
                return Undecidable("error")  # PostgreSQL: LIKE pattern must not end with escape character
            tokens.append(pattern[i + 1])
            i += 2
            continue
        tokens.append(None if c == "%" else "" if c == "_" else c)
        i += 1
    if tokens.count(None) > 1 and len(value) * len(tokens) > LIKE_MAX_STEPS:
        return Undecidable("too_large")  # backtracking over several % could take that many steps
    return _match(value, tokens)


def _match(text: str, tokens: list[str | None]) -> bool:
    t = p = 0
    star, mark = -1, 0
    while t < len(text):
        if p < len(tokens) and tokens[p] is not None and (tokens[p] == "" or tokens[p] == text[t]):
            t, p = t + 1, p + 1
        elif p < len(tokens) and tokens[p] is None:
            star, mark, p = p, t, p + 1
        elif star >= 0:
            mark += 1
            t, p = mark, star + 1
        else:
            return False
    return all(x is None for x in tokens[p:])


def cast(kind: str, a: Value) -> Value:
    """``a::kind`` for int, numeric, float, text, bool and timestamp (without time zone)."""
    if a is None or isinstance(a, Undecidable):
        return a
    if kind == "text":
        if isinstance(a, str):
            return a
        if isinstance(a, bool):
            return "true" if a else "false"
        return str(a) if isinstance(a, int) and -_INT8 <= a < _INT8 else Undecidable("cast")
    if kind == "bool":
        b = truth(a)
        return (a != 0) if isinstance(a, int) and not isinstance(a, bool) else b
    if kind == "timestamp":
        t = _timestamp(a)
        return t if t is not None and t.tzinfo is None else Undecidable("temporal")
    if isinstance(a, bool):
        return Undecidable("cast")
    if isinstance(a, str) and kind == "int":
        if not _INT_TEXT.fullmatch(a) or len(a.strip()) > 20:
            return Undecidable("cast")  # not an integer's text, or past int8
        r = int(a)
        return r if -_INT8 <= r < _INT8 else Undecidable("overflow")
    x = _number(a)
    if x is None:
        return Undecidable("cast")
    if kind == "float":
        f = _double(x)
        return Undecidable("overflow") if f is None else f
    if kind == "num":
        return Undecidable("cast") if isinstance(x, float) else Decimal(x)
    if isinstance(x, float):
        r = round(x)  # double → integer rounds half to even, as rint()
    elif Decimal(x).adjusted() >= 19:
        return Undecidable("overflow")  # past int8 (and no integer of a billion digits made)
    else:
        r = int(Decimal(x).to_integral_value(ROUND_HALF_UP))  # numeric → integer rounds half away from zero
    return r if -_INT8 <= r < _INT8 else Undecidable("overflow")


def date_trunc(unit: str, a: Value) -> Value:
    """``date_trunc(unit, a)`` on a timestamp without time zone (with one, the session's zone decides)."""
    if a is None or isinstance(a, Undecidable):
        return a
    t = _timestamp(a) if isinstance(a, str) and ("T" in a or " " in a.strip()) else a
    if not isinstance(t, datetime) or t.tzinfo is not None or unit not in TRUNC_UNITS:
        return Undecidable("temporal")
    if unit == "week":
        t = datetime.fromordinal(t.toordinal() - t.weekday())
    elif unit == "quarter":
        t = t.replace(month=(t.month - 1) // 3 * 3 + 1)
    parts = {"year": 1, "quarter": 2, "month": 2, "week": 3, "day": 3, "hour": 4, "minute": 5, "second": 6}[unit]
    fields = [t.year, t.month, t.day, t.hour, t.minute, t.second][:parts]
    return datetime(*(fields + [1] * max(0, 3 - parts)))  # type: ignore[arg-type]


def text_function(name: str, a: Value) -> Value:
    """lower, upper, length of a string (non-ASCII case mapping is the database locale's: undecidable)."""
    if a is None or isinstance(a, Undecidable):
        return a
    if not isinstance(a, str):
        return Undecidable("type")
    if name == "length":
        return len(a)
    if not a.isascii():
        return Undecidable("locale")
    return a.lower() if name == "lower" else a.upper()


def absolute(a: Value) -> Value:
    if a is None or isinstance(a, Undecidable):
        return a
    x = _number(a)
    if x is None:
        return Undecidable("type")
    return x.copy_abs() if isinstance(x, Decimal) else abs(x)


__all__ = ["TRUNC_UNITS", "UNAVAILABLE", "Undecidable", "Value", "absolute", "arith", "cast", "compare",
           "date_trunc", "holds", "like", "negate", "of_image", "text_function", "truth", "undecidable"]  # fmt: skip
