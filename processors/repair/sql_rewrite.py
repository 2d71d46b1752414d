"""Protected forms of a statement: an edit of its sqlglot AST, and the same edit as minimal text insertions.

The AST edit (rendered with the postgres dialect) is the SQL-level repair for services in any language. The text
insertions are what the Python repair writes into the code, so the developer's own spelling of the statement is
kept; both must agree (the edited text re-parses to the edited AST) or the rewrite is refused. Statements use
psycopg's positional ``%s`` placeholders: they become ``$n`` for sqlglot and ``%s`` again when rendered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Final

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokenizer_core import Token

from processors.sql_access import _number_qmarks, _psycopg_to_qmark

DIALECT: Final = "postgres"
SERIALIZABLE_BEGIN: Final = {"before": "BEGIN", "after": "BEGIN ISOLATION LEVEL SERIALIZABLE"}
_PLAIN_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]*")
_COMPARISONS: Final[dict[type[exp.Expression], type[exp.Expression]]] = {
    exp.GTE: exp.LTE,
    exp.GT: exp.LT,
    exp.LTE: exp.GTE,
    exp.LT: exp.GT,
}
_AGGREGATING: Final = ("group", "having", "distinct", "windows")


class RewriteError(ValueError):
    """The statement cannot be rewritten into the requested protected form."""


@dataclass(frozen=True, slots=True)
class CopyParam:
    """Bind a new placeholder to the same value as an existing one (0-based among the original placeholders)."""

    index: int


@dataclass(frozen=True, slots=True)
class VarParam:
    """Bind a new placeholder to a variable the code has in scope: the row ``version`` read, or the ``key``."""

    role: str  # version | idempotency_key


ParamSource = CopyParam | VarParam


@dataclass(frozen=True, slots=True)
class SqlEdit:
    """One statement rewritten: the recorded text, its protected text, and how to get from one to the other."""

    before: str
    after: str  # the recorded text with the insertions: what the repaired code runs
    canonical: str  # the edited AST rendered by sqlglot (postgres, ``%s`` placeholders)
    insertions: tuple[tuple[int, str], ...]  # (offset into ``before``, text), ascending
    new_params: tuple[tuple[int, ParamSource], ...]  # (index among ``after``'s placeholders, value)


def parse(statement: str) -> exp.Expression:
    """One statement with positional ``%s`` placeholders → its sqlglot AST (placeholders as ``$n``)."""
    if "%(" in statement:
        raise RewriteError("named placeholders are not supported")
    try:
        trees = sqlglot.parse(_number_qmarks(_psycopg_to_qmark(statement), DIALECT), dialect=DIALECT)
    except (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise RewriteError(f"unparseable statement: {exc}") from exc
    found = [t for t in trees if isinstance(t, exp.Expression)]
    if len(found) != 1:
        raise RewriteError("expected exactly one statement")
    return found[0]


def render(tree: exp.Expression) -> tuple[str, list[int]]:
    """An AST → psycopg text (``$n`` → ``%s``, literal ``%`` → ``%%``) and the ``n`` of each placeholder in order."""
    text = tree.sql(dialect=DIALECT)
    tokens = Dialect.get_or_raise(DIALECT).tokenize(text)
    out: list[str] = []
    order: list[int] = []
    last = 0
    for tok, nxt in zip(tokens, [*tokens[1:], None], strict=True):
        if tok.token_type == TokenType.PARAMETER and nxt is not None and nxt.token_type == TokenType.NUMBER:
            out += (text[last : tok.start].replace("%", "%%"), "%s")
            order.append(int(nxt.text))
            last = nxt.end + 1
    out.append(text[last:].replace("%", "%%"))
    return "".join(out), order


def placeholders(statement: str) -> int:
    """How many positional placeholders a statement has."""
    return len(render(parse(statement))[1])


def identifier(name: str) -> exp.Identifier:
    """A column name from configuration or code as a sqlglot identifier, quoted unless plainly lower-case."""
    return exp.to_identifier(name, quoted=_PLAIN_IDENTIFIER.fullmatch(name) is None)


# -- the four statement rewrites ---------------------------------------------------------------------------------
def row_lock(statement: str) -> SqlEdit:
    """``SELECT ...`` → ``SELECT ... FOR UPDATE``."""
    tree = parse(statement)
    if not isinstance(tree, exp.Select):
        raise RewriteError("row lock: not a plain SELECT")
    if tree.args.get("locks"):
        raise RewriteError("row lock: the SELECT already locks")
    if any(tree.args.get(k) for k in _AGGREGATING) or tree.find(exp.AggFunc) is not None:
        raise RewriteError("row lock: FOR UPDATE is not allowed with aggregates, DISTINCT or GROUP BY")
    after = tree.copy()
    after.set("locks", [exp.Lock(update=True)])
    return _finish(statement, after, [(_end(_tokens(statement)), " FOR UPDATE")], {})


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
        for conjunct in _and_terms(_parse_predicate(text)):
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
    condition = exp.EQ(this=exp.Column(this=identifier(version_column)), expression=_param(n + 1))
    return _append_where(statement, tree, [condition], {n + 1: VarParam("version")})


def idempotency_guard(statement: str, key_column: str) -> SqlEdit:
    """``INSERT INTO t (a) VALUES (%s)`` → ``INSERT INTO t (a, key) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING``."""
    tree = parse(statement)
    if not isinstance(tree, exp.Insert) or tree.args.get("conflict") is not None:
        raise RewriteError("idempotency guard: not an INSERT without ON CONFLICT")
    schema, values = tree.this, tree.expression
    if not isinstance(schema, exp.Schema) or not isinstance(values, exp.Values) or len(values.expressions) != 1:
        raise RewriteError("idempotency guard: needs a column list and a single VALUES row")
    row = values.expressions[0]
    if not isinstance(row, exp.Tuple):
        raise RewriteError("idempotency guard: the VALUES row is not a tuple")
    tokens = _tokens(statement)
    after = tree.copy()
    insertions: list[tuple[int, str]] = []
    params: dict[int, ParamSource] = {}
    column = identifier(key_column)
    if key_column not in [c.name for c in schema.expressions]:
        n = len(render(tree)[1])
        after.this.append("expressions", column.copy())
        after.expression.expressions[0].append("expressions", _param(n + 1))
        columns_close, values_close = _insert_parens(tokens)
        insertions += [(columns_close, ", " + column.sql(dialect=DIALECT)), (values_close, ", %s")]
        params[n + 1] = VarParam("idempotency_key")
    conflict = exp.OnConflict(action=exp.var("DO NOTHING"), conflict_keys=[column.copy()])
    after.set("conflict", conflict)
    insertions.append((_clause_end(tokens), f" ON CONFLICT ({column.sql(dialect=DIALECT)}) DO NOTHING"))
    return _finish(statement, after, insertions, params)


def existing_row_query(statement: str, key_column: str) -> str | None:
    """The SELECT that answers a repeated request with the row the first one inserted (None without RETURNING)."""
    tree = parse(statement)
    returning = tree.args.get("returning")
    if not isinstance(tree, exp.Insert) or not isinstance(returning, exp.Returning):
        return None
    table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    if not isinstance(table, exp.Table):
        return None
    condition = exp.EQ(this=exp.Column(this=identifier(key_column)), expression=_param(1))
    select = exp.select(*[e.copy() for e in returning.expressions]).from_(table.copy()).where(condition)
    text, _ = render(select)
    parse(text)  # it must re-parse
    return text


# -- helpers -----------------------------------------------------------------------------------------------------
def _param(n: int) -> exp.Parameter:
    return exp.Parameter(this=exp.Literal(this=str(n), is_string=False))


def _parse_predicate(text: str) -> exp.Expression:
    try:
        tree = sqlglot.parse_one(text, dialect=DIALECT)
    except SqlglotError as exc:
        raise RewriteError(f"invariant {text!r}: {exc}") from exc
    if not isinstance(tree, exp.Expression):
        raise RewriteError(f"invariant {text!r}: not an expression")
    return tree


def _and_terms(node: exp.Expression) -> list[exp.Expression]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _and_terms(node.this) + _and_terms(node.expression)
    return [node]


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
    amount: exp.Expression = _param(new_param)
    if limit > 0:
        amount = exp.Add(this=amount, expression=_literal(limit))
    elif limit < 0:
        amount = exp.Sub(this=amount, expression=_literal(-limit))
    return kind(this=target, expression=amount), -delta - 1


def _append_where(
    statement: str, tree: exp.Update, conditions: list[exp.Expression], params: dict[int, ParamSource]
) -> SqlEdit:
    """AND ``conditions`` onto the WHERE clause (parenthesising a top-level OR), before any RETURNING."""
    tokens = _tokens(statement)
    after = tree.copy()
    where = after.args.get("where")
    text = " AND ".join(render(c)[0] for c in conditions)
    at = _clause_end(tokens)
    if where is None:
        after.set("where", exp.Where(this=_conjunction(conditions)))
        return _finish(statement, after, [(at, " WHERE " + text)], params)
    inner = where.this
    first = exp.Paren(this=inner) if isinstance(inner, exp.Or) else inner
    after.set("where", exp.Where(this=_conjunction([first, *conditions])))
    insertions = [(at, " AND " + text)]
    if isinstance(inner, exp.Or):
        depths = _depths(tokens)
        start = next(i for i, t in enumerate(tokens) if t.token_type == TokenType.WHERE and depths[i] == 0)
        insertions.insert(0, (tokens[start + 1].start, "("))
        insertions[1] = (at, ") AND " + text)
    return _finish(statement, after, insertions, params)


def _conjunction(terms: list[exp.Expression]) -> exp.Expression:
    """``a AND b AND c`` as the parser builds it (left-deep, no added parentheses)."""
    out = terms[0]
    for term in terms[1:]:
        out = exp.And(this=out, expression=term)
    return out


def _finish(
    statement: str, after: exp.Expression, insertions: list[tuple[int, str]], params: dict[int, ParamSource]
) -> SqlEdit:
    """Apply the insertions and check them against the edited AST; place the new parameters."""
    ordered = sorted(insertions, key=lambda i: i[0])
    text = statement
    for at, piece in reversed(ordered):
        text = text[:at] + piece + text[at:]
    canonical, order = render(after)
    if render(parse(text))[0] != canonical:
        raise RewriteError("the text rewrite does not match the AST rewrite")
    if any(n not in order for n in params) or len(order) != placeholders(statement) + len(params):
        raise RewriteError("the rewrite lost or duplicated a placeholder")
    new_params = tuple((order.index(n), source) for n, source in sorted(params.items()))
    return SqlEdit(statement, text, canonical, tuple(ordered), new_params)


def _tokens(statement: str) -> list[Token]:
    try:
        return list(Dialect.get_or_raise(DIALECT).tokenize(statement))
    except SqlglotError as exc:
        raise RewriteError(f"untokenizable statement: {exc}") from exc


def _depths(tokens: Sequence[Token]) -> list[int]:
    depth, out = 0, []
    for t in tokens:
        if t.token_type == TokenType.R_PAREN:
            depth -= 1
        out.append(depth)
        if t.token_type == TokenType.L_PAREN:
            depth += 1
    return out


def _end(tokens: Sequence[Token]) -> int:
    """Offset right after the statement's last token (before a trailing ``;``)."""
    body = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    if not body:
        raise RewriteError("empty statement")
    return body[-1].end + 1


def _clause_end(tokens: Sequence[Token]) -> int:
    """Offset where the WHERE clause ends: right after the token before a top-level RETURNING, else the end."""
    for i, (t, depth) in enumerate(zip(tokens, _depths(tokens), strict=True)):
        if depth == 0 and t.token_type == TokenType.RETURNING and i > 0:
            return tokens[i - 1].end + 1
    return _end(tokens)


def _insert_parens(tokens: Sequence[Token]) -> tuple[int, int]:
    """Offsets of the closing parens of an INSERT's column list and of its VALUES row."""
    depths = _depths(tokens)
    closes = [
        tokens[i - 1].end + 1
        for i, (t, d) in enumerate(zip(tokens, depths, strict=True))
        if t.token_type == TokenType.R_PAREN and d == 0 and i > 0
    ]
    values = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.VALUES and depths[i] == 0), None)
    if values is None or len(closes) < 2:
        raise RewriteError("idempotency guard: cannot find the column list and the VALUES row")
    before = [c for c in closes if c < tokens[values].start]
    after = [c for c in closes if c > tokens[values].start]
    if not before or not after:
        raise RewriteError("idempotency guard: cannot find the column list and the VALUES row")
    return before[-1], after[0]
