"""SQL text as trace-repro reads it: placeholders, literals, references to parameters, WHERE conjuncts.

Pure helpers over sqlglot trees shared by the access extractor (``processors.sql.access``), the repro compiler and
the repair planner: placeholder styles (``%s``, ``$1``, ``?``, ``:name``) normalised to numbered ``?``, the
parameter or literal a comparison binds, and binding a span's parameters into a reference.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect

from processors.model.events import Scalar, entity_key

DIALECT: Final = "postgres"
OPS: Final[dict[type[exp.Expression], str]] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
FLIP: Final = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


@dataclass(frozen=True, slots=True)
class Const:
    value: Scalar


@dataclass(frozen=True, slots=True)
class Pos:
    index: int  # 0-based index into DbCall.params


@dataclass(frozen=True, slots=True)
class Named:
    name: str


@dataclass(frozen=True, slots=True)
class Expr:
    """SQL text with bindable holes: parts[0] refs[0] parts[1] ... parts[-1]."""

    parts: tuple[str, ...]
    refs: tuple[Pos | Named, ...]
    fallback: tuple[str, ...]  # placeholder text to print when a ref is unbound


Ref = Const | Pos | Named | Expr


Key = Const | Pos | Named


class Unbound:
    """A placeholder with no parameter value on the span."""


UNBOUND: Final = Unbound()


def normalise_key_value(value: Any) -> Scalar:
    """Key values as both spans and Debezium give them: integral floats/Decimals → int."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if (
        isinstance(value, Decimal)
        and value.is_finite()
        and value == value.to_integral_value()
        and value.adjusted() < sys.int_info.default_max_str_digits  # 1E+999999999 is no int to make, nor to print
    ):
        return int(value)
    return str(value)


def identity_entity_key(table: str, columns: Sequence[str], values: Sequence[Any]) -> str:
    """Entity key of an insert keyed by its natural identity, e.g. ``charges:order_id=42``."""
    rendered = []
    for column, value in zip(columns, values, strict=True):
        v = normalise_key_value(value)
        rendered.append(f"{column}={'' if v is None else v}")
    return entity_key(table, tuple(rendered))


def psycopg_to_qmark(sql: str) -> str:
    """psycopg ``%s`` → ``?``, ``%(name)s`` → ``:name``, ``%%`` → ``%`` (psycopg ignores quoting too)."""
    if "%s" not in sql and "%(" not in sql:
        return sql
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "%" and i + 1 < n:
            nxt = sql[i + 1]
            if nxt == "%":
                out.append("%")
                i += 2
                continue
            if nxt in "sbt":
                out.append("?")
                i += 2
                continue
            if nxt == "(":
                close = sql.find(")", i + 2)
                name = sql[i + 2 : close] if close > 0 else ""
                if name.isidentifier() and close + 1 < n and sql[close + 1] in "sbt":
                    out.append(":" + name)
                    i = close + 2
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def number_qmarks(sql: str, dialect: str | None) -> str:
    """``?`` → ``$1, $2, ...`` in order of appearance (tokenizer-aware: not inside strings or comments)."""
    if "?" not in sql:
        return sql
    tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    if any(t.token_type == TokenType.PARAMETER for t in tokens):
        return sql  # already $n style; a `?` here is an operator
    pieces: list[str] = []
    last = k = 0
    for t in tokens:
        if (t.token_type == TokenType.PLACEHOLDER and t.text == "?") or t.text == "?::":  # `?::int` cast
            k += 1
            pieces += (sql[last : t.start], f"${k}")
            last = t.start + 1
    return "".join(pieces) + sql[last:]


def name_of(node: exp.Expression | None) -> str:
    if not isinstance(node, exp.Identifier):
        return "" if node is None else node.name
    return node.name if node.quoted else node.name.lower()


# PostgreSQL numbers its parameters $1 .. $65535; ``$`` and anything else is not a position (a non-ASCII digit such
# as ``$\u0661``, thousands of digits): a name, bound only by a parameter of that name.
_MAX_POSITION_DIGITS: Final = 5


def position(text: str) -> int | None:
    """The 0-based parameter index of ``$<text>`` (``text`` ASCII digits, 1 .. 99999), else None."""
    if 0 < len(text) <= _MAX_POSITION_DIGITS and text.isascii() and text.isdigit() and int(text) > 0:
        return int(text) - 1
    return None


def placeholder(node: exp.Expression) -> Pos | Named | None:
    if isinstance(node, exp.Parameter):
        inner = node.this
        if isinstance(inner, exp.Literal) and (index := position(inner.name)) is not None:
            return Pos(index)
        return Named(inner.name) if isinstance(inner, exp.Expression) else None
    if isinstance(node, exp.Placeholder) and node.name and node.name != "?":
        return Named(node.name)
    if isinstance(node, exp.Column) and not node.table and node.name[:1] == "$":
        index = position(node.name[1:])  # `$1` as the default dialect reads it
        return None if index is None else Pos(index)
    return None


def number(text: str) -> Scalar:
    """A numeric literal's value, exact: an int, a float that is the literal's own value (``1.5``, ``2e3``), else
    the literal's text (``1e400``, a 0.1 written with 30 digits, an integer past Python's int-string limit), which
    still compares as a number (``processors.sql.values``) and keeps entity keys apart (a float would make every
    such key ``inf``)."""
    digits = text.replace("_", "")
    if digits.isascii() and digits.isdigit() and len(digits) <= sys.int_info.default_max_str_digits:
        return int(digits)
    try:
        exact = Decimal(text)
    except (InvalidOperation, ValueError):
        return text
    if exact.is_finite() and len(text) <= 32:  # a float's shortest repr is never longer
        f = float(exact)
        if math.isfinite(f) and Decimal(repr(f)) == exact:
            return f
    return text


def literal(node: exp.Expression) -> Const | None:
    if isinstance(node, exp.Literal):
        return Const(node.name if node.is_string else number(node.name))
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        value = number(node.this.name)
        if isinstance(value, str):
            return Const("-" + value)
        if isinstance(value, int | float):
            return Const(-value)
    if isinstance(node, exp.Boolean):
        return Const(bool(node.this))
    if isinstance(node, exp.Null):
        return Const(None)
    return None


def template(node: exp.Expression) -> Expr:
    refs: list[Pos | Named] = []
    texts: list[str] = []

    def hole(n: exp.Expression) -> exp.Expression:
        ref = placeholder(n)
        if ref is None:
            return n
        refs.append(ref)
        texts.append(n.sql(dialect=DIALECT))
        return exp.Var(this=f"__trp{len(refs) - 1}__")

    text = node.transform(hole).sql(dialect=DIALECT)
    found = sorted((text.find(f"__trp{i}__"), i) for i in range(len(refs)))
    if any(pos < 0 for pos, _ in found):
        return Expr((node.sql(dialect=DIALECT),), (), ())
    parts, order, last = [], [], 0
    for pos, i in found:
        parts.append(text[last:pos])
        order.append(i)
        last = pos + len(f"__trp{i}__")
    parts.append(text[last:])
    return Expr(tuple(parts), tuple(refs[i] for i in order), tuple(texts[i] for i in order))


def ref_of(node: exp.Expression) -> Ref:
    while isinstance(node, exp.Cast | exp.Paren) and isinstance(node.this, exp.Expression):
        node = node.this
    return placeholder(node) or literal(node) or template(node)


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The AND-ed terms of a WHERE clause, in text order (iterative: long AND chains are deep trees)."""
    out: list[exp.Expression] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.Where | exp.Paren):
            stack.append(n.this)
        elif isinstance(n, exp.And):
            stack += (n.expression, n.this)
        elif isinstance(n, exp.Expression):
            out.append(n)
    return out


def comparison(node: exp.Expression) -> tuple[str, str, Ref] | None:
    """``col op value`` (either side), ``col IS [NOT] NULL``; None for anything else."""
    negate = False
    if isinstance(node, exp.Not) and isinstance(node.this, exp.Is):
        node, negate = node.this, True
    if isinstance(node, exp.Is) and isinstance(node.this, exp.Column):
        negate ^= bool(node.args.get("negate"))
        return name_of(node.this.this), "IS NOT" if negate else "IS", ref_of(node.expression)
    op = OPS.get(type(node))
    if op is None:
        return None
    left, right = node.this, node.expression
    if isinstance(left, exp.Column):
        return name_of(left.this), op, ref_of(right)
    if isinstance(right, exp.Column):
        return name_of(right.this), FLIP[op], ref_of(left)
    return None


def flag(node: exp.Expression) -> tuple[str, str, Ref] | None:
    """A boolean column used as a condition: ``on_call`` → (on_call, =, TRUE); ``NOT on_call`` → FALSE."""
    negate = False
    while isinstance(node, exp.Not | exp.Paren) and isinstance(node.this, exp.Expression):
        negate ^= isinstance(node, exp.Not)
        node = node.this
    if isinstance(node, exp.Column) and not placeholder(node):
        return name_of(node.this), "=", Const(not negate)
    return None


def in_list(node: exp.Expression) -> tuple[str, list[Ref]] | None:
    if isinstance(node, exp.In) and isinstance(node.this, exp.Column) and not node.args.get("query"):
        return name_of(node.this.this), [ref_of(e) for e in node.expressions]
    return None


def table_of(node: exp.Expression | None) -> tuple[str, str] | None:
    if isinstance(node, exp.Schema):
        node = node.this
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        return None
    return name_of(node.this), name_of(node.args.get("db"))


def in_place(column: str, value: exp.Expression) -> bool:
    """``col ± expr`` (either operand order for ``+``)."""
    if isinstance(value, exp.Paren):
        value = value.this
    if isinstance(value, exp.Sub):
        operands = [value.this]
    elif isinstance(value, exp.Add):
        operands = [value.this, value.expression]
    else:
        return False
    return any(isinstance(o, exp.Column) and name_of(o.this) == column for o in operands)


def bind(ref: Ref, params: tuple[Scalar, ...], named: Mapping[str, Scalar]) -> Scalar | Unbound:
    if isinstance(ref, Pos):  # (the most common reference first)
        index = ref.index
        return params[index] if index < len(params) else UNBOUND
    if isinstance(ref, Const):
        return ref.value
    if isinstance(ref, Named):
        return named.get(ref.name, UNBOUND)
    out = [ref.parts[0]]
    for hole, text, part in zip(ref.refs, ref.fallback, ref.parts[1:], strict=True):
        v = bind(hole, params, named)
        out += (text if isinstance(v, Unbound) else sql_literal(v), part)
    return "".join(out)


def sql_literal(value: Scalar) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return str(value)
    return "'" + value.replace("'", "''") + "'"
