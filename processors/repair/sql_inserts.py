"""The INSERT forms of a repair: an idempotency guard, an insert that does nothing on a conflict, the schema migration
a conflict clause needs (a unique index), what an INSERT writes into given columns, and the SELECT that answers a
repeated request with the row the first one inserted. Each is an edit of the sqlglot AST and the same edit as minimal
text insertions (:func:`processors.repair.sql_edit.finish`)."""

from __future__ import annotations

from collections.abc import Sequence

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.tokenizer_core import Token

from processors.repair.sql_edit import (
    DIALECT,
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
    tokens_of,
)


def _single_row_insert(statement: str, what: str) -> tuple[exp.Insert, exp.Schema]:
    tree = parse(statement)
    if not isinstance(tree, exp.Insert) or tree.args.get("conflict") is not None:
        raise RewriteError(f"{what}: not an INSERT without ON CONFLICT")
    schema, values = tree.this, tree.expression
    if not isinstance(schema, exp.Schema) or not isinstance(values, exp.Values) or len(values.expressions) != 1:
        raise RewriteError(f"{what}: needs a column list and a single VALUES row")
    if not isinstance(values.expressions[0], exp.Tuple):
        raise RewriteError(f"{what}: the VALUES row is not a tuple")
    return tree, schema


def _do_nothing(after: exp.Insert, tokens: Sequence[Token], columns: Sequence[str]) -> tuple[int, str]:
    """Set ``ON CONFLICT (columns) DO NOTHING`` on ``after``; the text insertion that says the same."""
    keys = [identifier(c) for c in columns]
    after.set("conflict", exp.OnConflict(action=exp.var("DO NOTHING"), conflict_keys=[k.copy() for k in keys]))
    listed = ", ".join(k.sql(dialect=DIALECT) for k in keys)
    return clause_end(tokens), f" ON CONFLICT ({listed}) DO NOTHING"


def idempotency_guard(statement: str, key_column: str) -> SqlEdit:
    """``INSERT INTO t (a) VALUES (%s)`` → ``INSERT INTO t (a, key) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING``."""
    tree, schema = _single_row_insert(statement, "idempotency guard")
    tokens = tokens_of(statement)
    after = tree.copy()
    insertions: list[tuple[int, str]] = []
    params: dict[int, ParamSource] = {}
    column = identifier(key_column)
    if key_column not in [c.name for c in schema.expressions]:
        n = len(render(tree)[1])
        after.this.append("expressions", column.copy())
        after.expression.expressions[0].append("expressions", param(n + 1))
        columns_close, values_close = _insert_parens(tokens)
        insertions += [(columns_close, ", " + column.sql(dialect=DIALECT)), (values_close, ", %s")]
        params[n + 1] = VarParam("idempotency_key")
    insertions.append(_do_nothing(after, tokens, [key_column]))
    return finish(statement, after, insertions, params)


def on_conflict_do_nothing(statement: str, columns: Sequence[str]) -> SqlEdit:
    """``INSERT INTO t (a, b) VALUES (%s, %s)`` → ``... ON CONFLICT (a) DO NOTHING``: the INSERT must set every
    conflict column (the values it conflicts on are its own)."""
    tree, schema = _single_row_insert(statement, "on conflict")
    inserted = [c.name for c in schema.expressions]
    missing = [c for c in columns if c not in inserted]
    if not columns or missing:
        raise RewriteError(f"on conflict: the INSERT does not set {', '.join(missing) or 'any column'}")
    after = tree.copy()
    return finish(statement, after, [_do_nothing(after, tokens_of(statement), columns)], {})


def inserted_values(statement: str, columns: Sequence[str]) -> list[int | exp.Expression]:
    """What an INSERT writes into each of ``columns``: its placeholder (0-based among its placeholders) or the
    literal expression."""
    tree, schema = _single_row_insert(statement, "inserted values")
    order = render(tree)[1]
    cells = dict(zip([c.name for c in schema.expressions], tree.expression.expressions[0].expressions, strict=False))
    out: list[int | exp.Expression] = []
    for column in columns:
        cell = cells.get(column)
        if isinstance(cell, exp.Parameter) and isinstance(cell.this, exp.Literal) and cell.this.name.isdigit():
            out.append(order.index(int(cell.this.name)))
        elif isinstance(cell, exp.Literal | exp.Boolean | exp.Null):
            out.append(cell.copy())
        else:
            raise RewriteError(f"the INSERT's value for {column} is neither a placeholder nor a literal")
    return out


def equality_columns(statement: str) -> list[str]:
    """The columns a SELECT's WHERE pins to one value each (``a = %s AND b = 'x'``, the value cast or not, as
    ``%(x)s::INTEGER``): the identity of what it looks for. Refused unless every term of the WHERE is such an
    equality."""
    tree = parse(statement)
    if not isinstance(tree, exp.Select):
        raise RewriteError("equality columns: not a SELECT")
    where = tree.args.get("where")
    terms = and_terms(where.this) if isinstance(where, exp.Where) else []
    columns: list[str] = []
    for term in terms:
        if not isinstance(term, exp.EQ):
            raise RewriteError(f"equality columns: {term.sql(dialect=DIALECT)} is not an equality")
        column, value = term.this, term.expression
        if not isinstance(column, exp.Column):
            column, value = value, column
        if isinstance(value, exp.Cast):  # ``%s::INTEGER``, as SQLAlchemy renders a bound value
            value = value.this
        if not isinstance(column, exp.Column) or not isinstance(value, exp.Parameter | exp.Literal | exp.Boolean):
            raise RewriteError(f"equality columns: {term.sql(dialect=DIALECT)} does not pin a column to a value")
        columns.append(column.name)
    if not columns:
        raise RewriteError("equality columns: the SELECT has no WHERE")
    return list(dict.fromkeys(columns))


def unique_index(statement: str, columns: Sequence[str]) -> str:
    """The migration an ``ON CONFLICT (columns)`` needs: ``CREATE UNIQUE INDEX IF NOT EXISTS t_a_b_key ON t (a, b)``
    on the INSERT's table (idempotent; existing duplicates must be merged before it can be created)."""
    tree, _ = _single_row_insert(statement, "unique index")
    table = tree.this.this
    if not isinstance(table, exp.Table):
        raise RewriteError("unique index: the INSERT names no table")
    name = identifier("_".join([table.name, *columns, "key"])[:63])
    index = exp.Index(this=name, table=table.copy(), params=exp.IndexParameters(
        columns=[exp.Ordered(this=exp.Column(this=identifier(c)), nulls_first=False) for c in columns]))  # fmt: skip
    create = exp.Create(this=index, kind="INDEX", unique=True, exists=True)
    text = create.sql(dialect=DIALECT)
    if sqlglot.parse_one(text, dialect=DIALECT).sql(dialect=DIALECT) != text:
        raise RewriteError("unique index: the migration does not round-trip")  # pragma: no cover - defensive
    return text


def existing_row_query(statement: str, key_column: str | Sequence[str]) -> str | None:
    """The SELECT that answers a repeated request with the row the first one inserted (None without RETURNING):
    the RETURNING columns where each key column equals a placeholder, in order."""
    tree = parse(statement)
    returning = tree.args.get("returning")
    if not isinstance(tree, exp.Insert) or not isinstance(returning, exp.Returning):
        return None
    table = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    if not isinstance(table, exp.Table):
        return None
    keys = [key_column] if isinstance(key_column, str) else list(key_column)
    conditions: list[exp.Expression] = [
        exp.EQ(this=exp.Column(this=identifier(k)), expression=param(i + 1)) for i, k in enumerate(keys)
    ]
    select = exp.select(*[e.copy() for e in returning.expressions]).from_(table.copy()).where(conjunction(conditions))
    text, _ = render(select)
    parse(text)  # it must re-parse
    return text


def _insert_parens(tokens: Sequence[Token]) -> tuple[int, int]:
    """Offsets of the closing parens of an INSERT's column list and of its VALUES row."""
    levels = depths(tokens)
    closes = [
        tokens[i - 1].end + 1
        for i, (t, d) in enumerate(zip(tokens, levels, strict=True))
        if t.token_type == TokenType.R_PAREN and d == 0 and i > 0
    ]
    values = next((i for i, t in enumerate(tokens) if t.token_type == TokenType.VALUES and levels[i] == 0), None)
    if values is None or len(closes) < 2:
        raise RewriteError("idempotency guard: cannot find the column list and the VALUES row")
    before = [c for c in closes if c < tokens[values].start]
    after = [c for c in closes if c > tokens[values].start]
    if not before or not after:
        raise RewriteError("idempotency guard: cannot find the column list and the VALUES row")
    return before[-1], after[0]
