"""Recorded statements → what a repro may execute: psycopg placeholders, and a shape checked with sqlglot.

A repro runs recorded SQL, which is untrusted text, so a statement is replayed only if it parses as exactly one
SELECT / INSERT / UPDATE / DELETE on the incident's table (unqualified or in ``public``), with no unknown function
calls (``pg_sleep``, ``pg_read_file``, ``set_config``, ...), no CTE and no INTO; anything else (``DROP TABLE``,
``COPY ... TO PROGRAM``, two statements in one) is refused with a ``ReproError`` that says why. What passes still runs
as an unprivileged role with a statement timeout, on a scratch database of its own (``template_database``). The shape
(kind, selected and returned columns, literal SET values, key predicates) is what the compiler derives the
expected results from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from processors.sql import conjuncts
from processors.sql.syntax import Expr, Unbound, bind, comparison, flag, in_list

_DIALECT = "postgres"
_IDENT = re.compile(r"[A-Za-z0-9_$]")
_LEADING = re.compile(r"^(?:\s+|--[^\n]*(?:\n|$)|/\*.*?\*/)*", re.S)
_OBJECTS = {"TABLE", "DATABASE", "SCHEMA", "ROLE", "USER", "FUNCTION", "PROCEDURE", "INDEX", "VIEW", "EXTENSION"}
_ONLY = "a repro replays only SELECT/INSERT/UPDATE/DELETE, one statement on the incident's table"


class ReproError(ValueError):
    """An incident (or a statement of it) that cannot be turned into a repro."""


@dataclass(frozen=True, slots=True)
class Placeholders:
    """A statement in psycopg form (``%s``), its parameters in that order, and a ``$n`` form for parsing."""

    sql: str
    params: list[Any] | None  # None: execute without parameters (no placeholder processing)
    numbered: str


@dataclass(frozen=True, slots=True)
class Shape:
    """What a statement does, as far as the repro needs to know."""

    kind: str  # read | write | insert | delete
    locking: bool  # SELECT ... FOR UPDATE / FOR SHARE
    columns: list[str] | None  # selected or RETURNING columns when all are plain columns, else None
    sets: dict[str, Any] = field(default_factory=dict)  # column → bound literal value (UPDATE SET / INSERT)
    set_expressions: list[str] = field(default_factory=list)  # columns set to an expression (stock - 1)
    inserted: list[str] = field(default_factory=list)  # INSERT column list
    equals: dict[str, Any] = field(default_factory=dict)  # WHERE col = value (bound)
    terms: list[tuple[str, str, Any]] = field(default_factory=list)  # every WHERE term with its bound value
    exact: bool = True  # ``terms`` are the whole WHERE (False: a term that cannot be evaluated on a row image)
    aggregate: bool = False  # a SELECT that aggregates (its result is not the rows it selects)
    counts: bool = False  # ``SELECT count(*)`` (one row: how many rows the WHERE selects)
    relative: list[str] = field(default_factory=list)  # set from their own value (``x = x + 1``)


def _scan(statement: str) -> list[tuple[str, str]]:
    """Split into ("text", s) and ("ph", token) pieces; quotes, dollar quotes and comments are text."""
    out: list[tuple[str, str]] = []
    buf: list[str] = []
    i, n = 0, len(statement)

    def flush() -> None:
        if buf:
            out.append(("text", "".join(buf)))
            buf.clear()

    while i < n:
        c = statement[i]
        nxt = statement[i + 1] if i + 1 < n else ""
        if c == "'":
            escaped = i > 0 and statement[i - 1] in "eE" and (i < 2 or not _IDENT.match(statement[i - 2]))
            j = i + 1
            while j < n:
                if escaped and statement[j] == "\\":
                    j += 2
                    continue
                if statement[j] == "'":
                    if j + 1 < n and statement[j + 1] == "'":
                        j += 2
                        continue
                    break
                j += 1
            buf.append(statement[i : j + 1])
            i = j + 1
        elif c == '"':
            j = statement.find('"', i + 1)
            j = n - 1 if j < 0 else j
            buf.append(statement[i : j + 1])
            i = j + 1
        elif c == "-" and nxt == "-":
            j = statement.find("\n", i)
            j = n if j < 0 else j
            buf.append(statement[i:j])
            i = j
        elif c == "/" and nxt == "*":
            j = statement.find("*/", i + 2)
            j = n if j < 0 else j + 2
            buf.append(statement[i:j])
            i = j
        elif c == "$" and (i == 0 or not _IDENT.match(statement[i - 1])):
            number = re.match(r"\$(\d+)", statement[i:])
            tag = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$", statement[i:])
            if number:
                flush()
                out.append(("ph", number.group(0)))
                i += len(number.group(0))
            elif tag:
                end = statement.find(tag.group(0), i + len(tag.group(0)))
                end = n if end < 0 else end + len(tag.group(0))
                buf.append(statement[i:end])
                i = end
            else:
                buf.append(c)
                i += 1
        elif c == "%":
            named = re.match(r"%\([^)]*\)[sbt]", statement[i:])
            if nxt == "%":
                flush()
                out.append(("ph", "%%"))
                i += 2
            elif nxt in ("s", "b", "t"):
                flush()
                out.append(("ph", "%" + nxt))
                i += 2
            elif named:
                flush()
                out.append(("ph", named.group(0)))
                i += len(named.group(0))
            else:
                buf.append(c)
                i += 1
        elif c == "?":
            flush()
            out.append(("ph", "?"))
            i += 1
        else:
            buf.append(c)
            i += 1
    flush()
    return out


def to_psycopg(statement: str, params: list[Any], *, in_order: bool = False) -> Placeholders:
    """The statement with ``%s`` placeholders and its parameters in placeholder order (``$n`` / ``?`` converted);
    ``in_order``: the parameters are known to be in the placeholders' order of appearance (read off the row images,
    :mod:`processors.repro.image_params`), so named ``%(name)s`` placeholders can take them (recorded ones cannot:
    a list of them does not say which name each value had)."""
    pieces = _scan(statement)
    marks = [p for kind, p in pieces if kind == "ph" and p != "%%"]
    if any(m.startswith("%(") for m in marks) and not (in_order and len(params) == len(marks)):
        raise ReproError("named %(name)s placeholders need named parameters, which telemetry does not carry")
    styles = {"psycopg" if m.startswith("%") else "numeric" if m.startswith("$") else "qmark" for m in marks}
    if len(styles) > 1:
        raise ReproError(f"mixed placeholder styles {sorted(styles)}")
    style = styles.pop() if styles else "none"
    sql: list[str] = []
    numbered: list[str] = []
    ordered: list[Any] = []
    k = 0
    for kind, p in pieces:
        if kind == "text":
            sql.append(p if style == "psycopg" else p.replace("%", "%%"))
            numbered.append(p)
        elif p == "%%":
            sql.append("%%")
            numbered.append("%")
        else:
            k += 1
            numbered.append(f"${k}")
            sql.append("%s")
            if style == "numeric":
                index = int(p[1:]) - 1
                if not 0 <= index < len(params):
                    raise ReproError(f"placeholder {p} has no recorded parameter ({len(params)} recorded)")
                ordered.append(params[index])
            else:
                if k > len(params):
                    raise ReproError(f"{len(marks)} placeholders but {len(params)} recorded parameters")
                ordered.append(params[k - 1])
    if style in ("psycopg", "qmark") and k != len(params):
        raise ReproError(f"{k} placeholders but {len(params)} recorded parameters")
    if style == "none":
        if params:
            raise ReproError(f"no placeholders but {len(params)} recorded parameters")
        return Placeholders(statement, None, "".join(numbered))
    return Placeholders("".join(sql), ordered, "".join(numbered))


def numbered(statement: str) -> tuple[str, int]:
    """The statement with ``$n`` placeholders (in order of appearance, ``$n`` kept) and how many there are."""
    out: list[str] = []
    count = 0
    for kind, p in _scan(statement):
        if kind == "text" or p == "%%":
            out.append(p if kind == "text" else "%")
        elif p.startswith("$"):
            count = max(count, int(p[1:]))
            out.append(p)
        else:
            count += 1
            out.append(f"${count}")
    return "".join(out), count


def _bound(node: exp.Expression, params: list[Any] | None) -> tuple[bool, Any]:
    """(True, value) for a placeholder or a literal, else (False, None)."""
    while isinstance(node, exp.Cast | exp.Paren) and isinstance(node.this, exp.Expression):
        node = node.this
    if isinstance(node, exp.Parameter) and isinstance(node.this, exp.Literal) and node.this.name.isdigit():
        index = int(node.this.name) - 1
        if params is not None and 0 <= index < len(params):
            return True, params[index]
        return False, None
    if isinstance(node, exp.Literal):
        if node.is_string:
            return True, node.name
        for convert in (int, float):
            try:
                return True, convert(node.name)
            except ValueError:
                pass
        return False, None
    if isinstance(node, exp.Boolean):
        return True, bool(node.this)
    if isinstance(node, exp.Null):
        return True, None
    return False, None


def _plain_columns(nodes: list[exp.Expression]) -> list[str] | None:
    names = []
    for node in nodes:
        if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
            return None
        names.append(node.name)
    return names


def shape(statement: Placeholders, table: str) -> Shape:
    """The statement's shape; raises ReproError unless it is one plain DML statement on ``table``."""
    try:
        trees = [t for t in sqlglot.parse(statement.numbered, dialect=_DIALECT) if t is not None]
    except (SqlglotError, ValueError, RecursionError) as exc:
        raise ReproError(f"statement does not parse: {exc}") from None
    if len(trees) != 1:
        raise ReproError(f"refused recorded SQL: {len(trees)} statements in one ({_ONLY})")
    tree = trees[0]
    if not isinstance(tree, exp.Select | exp.Insert | exp.Update | exp.Delete):
        raise ReproError(f"refused recorded SQL: {_kind(tree, statement.numbered)} is not replayed ({_ONLY})")
    for node in tree.walk():
        if isinstance(node, exp.Anonymous):
            raise ReproError(f"refused recorded SQL: it calls {node.name}(), which a repro does not run ({_ONLY},"
                             " calling only built-in expressions)")  # fmt: skip
        if isinstance(node, exp.Command | exp.With | exp.Into):
            what = node.name.upper() if isinstance(node, exp.Command) else type(node).__name__.upper()
            raise ReproError(f"refused recorded SQL: it uses {what} ({_ONLY}, without WITH or INTO)")
        if isinstance(node, exp.Table) and (node.name != table or node.catalog or node.db not in ("", "public")):
            named = ".".join(p for p in (node.catalog, node.db, node.name) if p) or "a table function"
            raise ReproError(f"refused recorded SQL: it names {named!r}, not the incident's table {table!r} ({_ONLY})")
    params = statement.params
    returning = tree.args.get("returning")
    returned = _plain_columns(list(returning.expressions)) if isinstance(returning, exp.Returning) else []
    equals: dict[str, Any] = {}
    for term in conjuncts(tree.args.get("where")):
        if isinstance(term, exp.EQ) and isinstance(term.this, exp.Column):
            ok, value = _bound(term.expression, params)
            if ok:
                equals.setdefault(term.this.name, value)
    terms, exact = _terms(tree.args.get("where"), params)
    if isinstance(tree, exp.Select):
        locks = tree.args.get("locks") or []
        grouped = any(tree.args.get(k) for k in ("group", "having", "distinct", "windows"))
        aggregate = grouped or tree.find(exp.AggFunc) is not None
        only = tree.expressions[0] if len(tree.expressions) == 1 else None
        counts = not grouped and isinstance(only, exp.Count) and isinstance(only.this, exp.Star)
        return Shape("read", bool(locks), _plain_columns(list(tree.expressions)), equals=equals, terms=terms,
                     exact=exact, aggregate=aggregate, counts=counts)  # fmt: skip
    if isinstance(tree, exp.Update):
        sets: dict[str, Any] = {}
        exprs: list[str] = []
        relative: list[str] = []
        for assignment in tree.expressions:
            if isinstance(assignment, exp.EQ) and isinstance(assignment.this, exp.Column):
                column = assignment.this.name
                ok, value = _bound(assignment.expression, params)
                if ok:
                    sets[column] = value
                    continue
                exprs.append(column)
                if any(c.name == column for c in assignment.expression.find_all(exp.Column)):
                    relative.append(column)
        return Shape("write", False, returned, sets, exprs, relative=relative, equals=equals, terms=terms,
                     exact=exact)  # fmt: skip
    if isinstance(tree, exp.Insert):
        inserted: list[str] = []
        sets = {}
        if isinstance(tree.this, exp.Schema):
            inserted = [c.name for c in tree.this.expressions]
        values = tree.expression
        if isinstance(values, exp.Values) and values.expressions:
            row = values.expressions[0]
            cells = list(row.expressions) if isinstance(row, exp.Tuple) else [row]
            for column, cell in zip(inserted, cells, strict=False):
                ok, value = _bound(cell, params)
                if ok:
                    sets[column] = value
        return Shape("insert", False, returned, sets, [], inserted, equals)
    return Shape("delete", False, returned, equals=equals, terms=terms, exact=exact)


def _kind(node: exp.Expr, text: str) -> str:
    """What a refused statement is, in SQL words (``DROP TABLE``, ``COPY``, ``EXPLAIN``): a message, not a check."""
    if isinstance(node, exp.Command):
        return node.name.upper()
    words = _LEADING.sub("", text).split()[:2]
    kind = [w.upper() for w in words if w.isalpha()][:2]
    return " ".join(kind if kind[1:] and kind[1] in _OBJECTS else kind[:1]) or type(node).__name__


def _terms(where: exp.Expression | None, params: list[Any] | None) -> tuple[list[tuple[str, str, Any]], bool]:
    """The WHERE's terms (``col op value``, ``col IN (...)``, a boolean column) with their values bound, and
    whether they are all of it (an OR, a function or an expression of the row makes the WHERE inexact)."""
    bound = tuple(params or ())
    out: list[tuple[str, str, Any]] = []
    exact = True
    for node in conjuncts(where):
        found = comparison(node) or flag(node)
        listed = in_list(node) if found is None else None
        if found is not None and not isinstance(found[2], Expr):
            value = bind(found[2], bound, {})
            if not isinstance(value, Unbound):
                out.append((found[0], found[1], value))
                continue
        elif listed is not None and not any(isinstance(r, Expr) for r in listed[1]):
            values = [bind(r, bound, {}) for r in listed[1]]
            if not any(isinstance(v, Unbound) for v in values):
                out.append((listed[0], "IN", tuple(values)))
                continue
        exact = False
    return out, exact


def normalise(statement: str) -> str:
    """Whitespace collapsed, no trailing semicolon: the form statements are compared in."""
    return " ".join(statement.split()).rstrip(";").rstrip()
