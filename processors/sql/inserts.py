"""The rows an ``INSERT`` names, in the three forms drivers and ORMs send them.

- ``INSERT INTO t (a, b) VALUES (?, ?), (?, ?)``: one row per tuple (a driver's ``executemany`` rewritten into one
  statement, SQLAlchemy's ``insertmanyvalues`` without RETURNING order, psycopg2's ``execute_values``, JDBC batches).
- ``INSERT INTO t (a, b) SELECT p0::VARCHAR, p1::INTEGER FROM (VALUES (?, ?, 0), (?, ?, 1)) AS imp_sen(p0, p1,
  sen_counter) ORDER BY sen_counter RETURNING ...``: SQLAlchemy 2's ``insertmanyvalues`` when it must return the
  new keys in order; each VALUES tuple is a row, its columns picked (and cast) by the SELECT list.
- ``INSERT INTO t (a, b) SELECT * FROM UNNEST((?)::varchar[], (?)::integer[])``: Django's ``bulk_create`` on
  PostgreSQL; each column is fed by one array parameter, so how many rows and which values are not in the text:
  one row of array expressions (``arrays``), never values to compare with a row image.

Anything else (``INSERT ... SELECT`` from a table, ``DEFAULT VALUES``, no column list) names no rows: a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from processors.sql.syntax import Ref, name_of, ref_of, template


@dataclass(frozen=True, slots=True)
class InsertRows:
    """The columns an INSERT sets and, per row, the reference that feeds each of them (in column order)."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Ref, ...], ...]
    arrays: bool = False  # UNNEST of arrays: one row of array expressions stands for an unknown number of rows


def insert_rows(tree: exp.Insert) -> InsertRows | str:
    """The rows ``tree`` inserts, or why they cannot be read from its text (``insert_no_values``, ``insert_arity``)."""
    if not isinstance(tree.this, exp.Schema) or not tree.this.expressions:
        return "insert_no_values"  # DEFAULT VALUES, no column list
    columns = tuple(name_of(c) for c in tree.this.expressions)
    source = tree.expression
    if isinstance(source, exp.Values):
        rows = [_refs(row) for row in source.expressions]
    elif isinstance(source, exp.Select) and _plain(source):
        found = _selected(source, len(columns))
        if isinstance(found, str):
            return found
        if isinstance(found, InsertRows):
            return InsertRows(columns, found.rows, arrays=True)
        rows = found
    else:
        return "insert_no_values"
    if not rows or any(len(r) != len(columns) for r in rows):
        return "insert_arity"
    return InsertRows(columns, tuple(rows))


def _refs(row: exp.Expression) -> tuple[Ref, ...]:
    return tuple(ref_of(v) for v in row.expressions) if isinstance(row, exp.Tuple) else (ref_of(row),)


def _plain(select: exp.Select) -> bool:
    """A SELECT over one source with nothing that filters, groups or joins (ORDER BY only orders the rows)."""
    return not any(select.args.get(k) for k in ("where", "joins", "group", "having", "limit", "offset", "distinct",
                                                  "with_", "with", "laterals", "qualify"))  # fmt: skip


def _selected(select: exp.Select, arity: int) -> list[tuple[Ref, ...]] | InsertRows | str:
    """The rows of ``SELECT <alias columns> FROM (VALUES ...) AS a(c...)`` or of ``SELECT * FROM UNNEST(...)``."""
    source = select.args.get("from_", select.args.get("from"))
    inner = source.this if isinstance(source, exp.From) else None
    if isinstance(inner, exp.Subquery) and isinstance(inner.this, exp.Values):
        alias, inner = inner.args.get("alias"), inner.this
    else:
        alias = inner.args.get("alias") if isinstance(inner, exp.Values) else None
    projections = select.expressions
    star = len(projections) == 1 and isinstance(projections[0], exp.Star)
    if isinstance(inner, exp.Unnest) and star:
        if len(inner.expressions) != arity:
            return "insert_arity"
        return InsertRows((), (tuple(template(e) for e in inner.expressions),), arrays=True)
    if not isinstance(inner, exp.Values):
        return "insert_no_values"  # INSERT ... SELECT from a table: its rows are not in the text
    names = [name_of(c) for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    rows = [_refs(row) for row in inner.expressions]
    if star:
        return rows
    picks: list[int] = []
    for p in projections:
        while isinstance(p, exp.Cast | exp.Paren | exp.Alias) and isinstance(p.this, exp.Expression):
            p = p.this
        if not isinstance(p, exp.Column) or name_of(p.this) not in names:
            return "insert_no_values"  # a computed column: its value is not one of the VALUES
        picks.append(names.index(name_of(p.this)))
    if any(len(r) != len(names) for r in rows):
        return "insert_arity"
    return [tuple(r[i] for i in picks) for r in rows]


__all__ = ["InsertRows", "insert_rows"]
