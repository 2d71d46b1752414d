"""Protected forms of a statement: a row lock (``FOR UPDATE``, ``FOR SHARE``, or an aggregate over its rows locked
in a subquery), an atomic conditional update, an optimistic version check, each an edit of its sqlglot AST and the
same edit as minimal text insertions (the INSERT forms are in :mod:`processors.repair.sql_inserts`).

The AST edit (rendered with the postgres dialect) is the SQL-level repair for services in any language. The text
insertions are what the Python repair writes into the code, so the developer's own spelling of the statement is
kept; both must agree (:func:`processors.repair.sql_edit.finish`) or the rewrite is refused. An atomic update
turns each invariant bound on a column the UPDATE changes in place (``c = c - 1`` with ``c >= 0``) into a guard on
the old value (``c >= 1``); a placeholder amount (``c = c - %s``) gets a new placeholder bound to the same value.
Without a configured invariant, a decrement implies its own (:func:`implied_invariants`: the column stays >= 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Final

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.errors import SqlglotError

from processors.repair.sql_edit import (
    DIALECT,
    CopyParam,
    ParamSource,
    RewriteError,
    SqlEdit,
    VarParam,
    and_terms,
    clause_end,
    conjunction,
    depths,
    finish,
    identifier,
    param,
    parse,
    render,
    statement_end,
    tokens_of,
)

SERIALIZABLE_BEGIN: Final = {"before": "BEGIN", "after": "BEGIN ISOLATION LEVEL SERIALIZABLE"}
REPEATABLE_READ_BEGIN: Final = {"before": "BEGIN", "after": "BEGIN ISOLATION LEVEL REPEATABLE READ"}
_COMPARISONS: Final[dict[type[exp.Expression], type[exp.Expression]]] = {
    exp.GTE: exp.LTE,
    exp.GT: exp.LT,
    exp.LTE: exp.GTE,
    exp.LT: exp.GT,
}
_AGGREGATING: Final = ("group", "having", "distinct", "windows")
_NOT_WRAPPED: Final = ("group", "having", "distinct", "windows", "order", "limit", "offset", "joins", "with_", "with")


# -- the statement rewrites --------------------------------------------------------------------------------------
def row_lock(statement: str, *, share: bool = False) -> SqlEdit:
    """``SELECT ...`` → ``SELECT ... FOR UPDATE`` (``FOR SHARE`` with ``share``)."""
    tree = parse(statement)
    if not isinstance(tree, exp.Select):
        raise RewriteError("row lock: not a plain SELECT")
    if tree.args.get("locks"):
        raise RewriteError("row lock: the SELECT already locks")
    if any(tree.args.get(k) for k in _AGGREGATING) or tree.find(exp.AggFunc) is not None:
        raise RewriteError("row lock: FOR UPDATE is not allowed with aggregates, DISTINCT or GROUP BY")
    after = tree.copy()
    after.set("locks", [exp.Lock(update=not share)])
    clause = " FOR SHARE" if share else " FOR UPDATE"
    return finish(statement, after, [(statement_end(tokens_of(statement)), clause)], {})


def locked_aggregate(statement: str, *, share: bool = False) -> SqlEdit:
    """``SELECT count(*) FROM t WHERE p`` → ``SELECT count(*) FROM (SELECT * FROM t WHERE p FOR UPDATE) AS t``.

    PostgreSQL refuses ``FOR UPDATE`` next to an aggregate; the aggregate over a subquery that locks the rows it
    selects locks the same rows, and a second transaction's subquery waits for them and re-reads them (the rows
    that no longer match fall out). Only a single-table aggregate with nothing after its WHERE is wrapped.
    """
    tree = parse(statement)
    if not isinstance(tree, exp.Select) or tree.args.get("locks"):
        raise RewriteError("locked aggregate: not a plain SELECT without a lock")
    if tree.find(exp.AggFunc) is None:
        raise RewriteError("locked aggregate: the SELECT does not aggregate (lock its rows directly)")
    if any(tree.args.get(k) for k in _NOT_WRAPPED):
        raise RewriteError("locked aggregate: only a single-table aggregate with nothing after its WHERE")
    source = tree.args.get("from_", tree.args.get("from"))
    table = source.this if isinstance(source, exp.From) else None
    if not isinstance(table, exp.Table) or not isinstance(table.this, exp.Identifier):
        raise RewriteError("locked aggregate: the SELECT does not read one table")
    tokens = tokens_of(statement)
    levels = depths(tokens)
    start = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.FROM and levels[i] == 0), None)
    if start is None or start + 1 >= len(tokens):
        raise RewriteError("locked aggregate: cannot find the FROM clause")
    alias = table.args.get("alias")
    name = alias.this if isinstance(alias, exp.TableAlias) and isinstance(alias.this, exp.Identifier) else table.this
    inner = exp.Select(expressions=[exp.Star()])
    inner.set("from_", exp.From(this=table.copy()))
    if tree.args.get("where") is not None:
        inner.set("where", tree.args["where"].copy())
    inner.set("locks", [exp.Lock(update=not share)])
    after = tree.copy()
    after.set("where", None)
    after.set("from_", exp.From(this=exp.Subquery(this=inner, alias=exp.TableAlias(this=name.copy()))))
    lock = "FOR SHARE" if share else "FOR UPDATE"
    insertions = [(tokens[start + 1].start, "(SELECT * FROM "),
                  (statement_end(tokens), f" {lock}) AS {name.sql(dialect=DIALECT)}")]  # fmt: skip
    return finish(statement, after, insertions, {})


def atomic_update(statement: str, invariants: Sequence[str]) -> SqlEdit:
    """``UPDATE t SET c = c - 1 WHERE k = %s`` with invariant ``c >= 0`` → ``... WHERE k = %s AND c >= 1``."""
    tree = parse(statement)
    if not isinstance(tree, exp.Update):
        raise RewriteError("atomic update: not an UPDATE")
    n = len(render(tree)[1])
    deltas = _in_place_deltas(tree)
    guards: list[exp.Expression] = []
    seen: set[str] = set()
    copies: dict[int, ParamSource] = {}
    for text in invariants:
        for conjunct in and_terms(_parse_predicate(text)):
            guard = _guard(conjunct, deltas, n + len(copies) + 1)
            if guard is None:
                continue
            expr, copied = guard
            key = _guard(conjunct, deltas, 0)
            if key is None or (same := key[0].sql(dialect=DIALECT)) in seen:
                continue  # the same bound stated twice (``stock >= 0`` and ``0 <= stock``)
            seen.add(same)
            if copied is not None:
                copies[n + len(copies) + 1] = CopyParam(copied)
            guards.append(expr)
    if not guards:
        raise RewriteError("atomic update: no invariant bounds a column this UPDATE changes in place")
    return _append_where(statement, tree, guards, copies)


def optimistic(statement: str, version_column: str) -> SqlEdit:
    """``UPDATE ... WHERE id = %s`` → ``... WHERE id = %s AND version = %s`` (the version read earlier)."""
    tree = parse(statement)
    if not isinstance(tree, exp.Update):
        raise RewriteError("optimistic: not an UPDATE")
    where = tree.args.get("where")
    if where is not None and any(c.name == version_column for c in where.find_all(exp.Column)):
        raise RewriteError("optimistic: the UPDATE already checks the version")
    n = len(render(tree)[1])
    condition = exp.EQ(this=exp.Column(this=identifier(version_column)), expression=param(n + 1))
    return _append_where(statement, tree, [condition], {n + 1: VarParam("version")})


def implied_invariants(statement: str) -> list[str]:
    """What an UPDATE that decrements a column in place assumes when no invariant is configured: the column stays
    non-negative (``stock = stock - 1`` → ``stock >= 0``, hence the guard ``stock >= 1``)."""
    tree = parse(statement)
    if not isinstance(tree, exp.Update):
        raise RewriteError("implied invariant: not an UPDATE")
    out = []
    for column, delta in _in_place_deltas(tree).items():
        if isinstance(delta, int) or delta < 0:  # an int is "minus placeholder k"
            out.append(f"{identifier(column).sql(dialect=DIALECT)} >= 0")
    if not out:
        raise RewriteError("implied invariant: the UPDATE decrements no column in place")
    return out


# -- invariants as guards ----------------------------------------------------------------------------------------
def _parse_predicate(text: str) -> exp.Expression:
    try:
        tree = sqlglot.parse_one(text, dialect=DIALECT)
    except SqlglotError as exc:
        raise RewriteError(f"invariant {text!r}: {exc}") from exc
    if not isinstance(tree, exp.Expression):
        raise RewriteError(f"invariant {text!r}: not an expression")
    return tree


def _number(node: exp.Expression) -> Decimal | None:
    if isinstance(node, exp.Neg):
        inner = _number(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return Decimal(node.name)
        except InvalidOperation:
            return None
    return None


def _literal(value: Decimal) -> exp.Expression:
    text = format(value.normalize(), "f") if value != value.to_integral_value() else str(int(value))
    return exp.Literal.number(text.lstrip("-")) if value >= 0 else exp.Neg(this=exp.Literal.number(text[1:]))


def _in_place_deltas(tree: exp.Update) -> dict[str, Decimal | int]:
    """Columns set in place: ``c = c + 5`` → {c: Decimal(5)}; ``c = c - $k`` → {c: -k} (placeholder k, 1-based)."""
    deltas: dict[str, Decimal | int] = {}
    for assignment in tree.expressions:
        if not isinstance(assignment, exp.EQ) or not isinstance(assignment.this, exp.Column):
            continue
        column, value = assignment.this.name, assignment.expression
        while isinstance(value, exp.Paren):
            value = value.this
        if not isinstance(value, exp.Add | exp.Sub):
            continue
        left, right = value.this, value.expression
        if isinstance(value, exp.Add) and isinstance(right, exp.Column) and right.name == column:
            left, right = right, left
        if not (isinstance(left, exp.Column) and left.name == column):
            continue
        number = _number(right)
        if number is not None:
            deltas[column] = number if isinstance(value, exp.Add) else -number
        elif isinstance(value, exp.Sub) and isinstance(right, exp.Parameter) and right.name.isdigit():
            deltas[column] = -int(right.name)  # int: "minus placeholder k"
    return deltas


def _guard(
    conjunct: exp.Expression, deltas: dict[str, Decimal | int], new_param: int
) -> tuple[exp.Expression, int | None] | None:
    """``c OP bound`` over the new value ``c + delta`` → a guard on the old value, and the placeholder it copies."""
    kind = type(conjunct)
    if kind not in _COMPARISONS:
        return None
    column, bound = conjunct.args.get("this"), conjunct.args.get("expression")
    if not isinstance(column, exp.Column):
        column, bound, kind = bound, column, _COMPARISONS[kind]
    if not isinstance(column, exp.Column) or not isinstance(bound, exp.Expression):
        return None
    limit = _number(bound)
    delta = deltas.get(column.name)
    if limit is None or delta is None:
        return None
    target = exp.Column(this=column.this.copy())
    if isinstance(delta, Decimal):  # c + d OP limit  ⟺  c OP limit - d
        return kind(this=target, expression=_literal(limit - delta)), None
    # c - $k OP limit  ⟺  c OP $k + limit, with a new placeholder bound to the same value as $k (column on the
    # left, so that the daemon's classifier sees the guard)
    amount: exp.Expression = param(new_param)
    if limit > 0:
        amount = exp.Add(this=amount, expression=_literal(limit))
    elif limit < 0:
        amount = exp.Sub(this=amount, expression=_literal(-limit))
    return kind(this=target, expression=amount), -delta - 1


# -- where the text goes -----------------------------------------------------------------------------------------
def _append_where(
    statement: str, tree: exp.Update, conditions: list[exp.Expression], params: dict[int, ParamSource]
) -> SqlEdit:
    """AND ``conditions`` onto the WHERE clause (parenthesising a top-level OR), before any RETURNING."""
    tokens = tokens_of(statement)
    after = tree.copy()
    where = after.args.get("where")
    text = " AND ".join(render(c)[0] for c in conditions)
    at = clause_end(tokens)
    if where is None:
        after.set("where", exp.Where(this=conjunction(conditions)))
        return finish(statement, after, [(at, " WHERE " + text)], params)
    inner = where.this
    first = exp.Paren(this=inner) if isinstance(inner, exp.Or) else inner
    after.set("where", exp.Where(this=conjunction([first, *conditions])))
    insertions = [(at, " AND " + text)]
    if isinstance(inner, exp.Or):
        levels = depths(tokens)
        start = next(i for i, t in enumerate(tokens) if t.token_type == TokenType.WHERE and levels[i] == 0)
        insertions.insert(0, (tokens[start + 1].start, "("))
        insertions[1] = (at, ") AND " + text)
    return finish(statement, after, insertions, params)
