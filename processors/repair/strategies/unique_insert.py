"""The unique insert: the predicate double insert (a phantom) made impossible by the database.

The writer looked for a row (``SELECT id FROM charges WHERE order_id = %s``), found none, and inserted one; two
requests doing that at once both insert. The columns the read pins to one value each are the identity of what it
looked for: a unique index on them (the plan's schema migration) and ``INSERT ... ON CONFLICT (<columns>) DO
NOTHING`` make the second INSERT insert nothing. The code then does what its own check does when it finds a row:
the check's branch, cloned after the INSERT (``if row is None: return -1``), when that branch does not use the row
it found; else it gets the row that was inserted first (a lookup on the RETURNING columns), as get-or-create code
expects. Refused when the read has a term that is not such an equality, or the INSERT does not set those columns.
"""

from __future__ import annotations

from functools import partial

import libcst as cst
from sqlglot import exp

from processors.repair import sql_inserts
from processors.repair.locate import CallSite
from processors.repair.source import walk
from processors.repair.sql_edit import RewriteError
from processors.repair.strategies.base import (
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    Op,
    Outcome,
    Writer,
    rewrite,
    sql_op,
)
from processors.repair.strategies.idempotency import existing_row
from processors.repair.strategies.no_row import assigned_name, rowcount_is_zero


def unique_insert(ctx: Context, w: Writer) -> Outcome:
    """A unique index on the columns the read pins, and the INSERT with ``ON CONFLICT (<columns>) DO NOTHING``."""
    inserts = [a for a in w.writes if a.operation == "insert"]
    if not inserts:
        raise NotApplicable("no INSERT to guard")
    out = Outcome()
    for insert in inserts:
        columns = identity(w, insert.statement)
        edit = rewrite(partial(sql_inserts.on_conflict_do_nothing, insert.statement, columns))
        migration = rewrite(partial(sql_inserts.unique_index, insert.statement, columns))
        values = rewrite(partial(sql_inserts.inserted_values, insert.statement, columns))
        query = sql_inserts.existing_row_query(insert.statement, columns)
        note = f"a second row for one ({', '.join(columns)}) inserts nothing"
        for site in ctx.sites(w, insert.statement):
            out.ops.append(sql_op(site, insert.statement, edit, []))
            found = _found_branch(ctx, site, note)
            if found is not None:
                out.ops += found
                continue
            args = _lookup_args(site.params, values)
            out.ops += existing_row(ctx, site, query if args else None, args or [], UNIQUE_INSERT, note,
                                    "inserted first")  # fmt: skip
        out.repairs.append(ctx.info(UNIQUE_INSERT, w, insert.statement, edit.after))
        out.rewrote(edit)
        if migration not in out.migrations:
            out.migrations.append(migration)
        out.notes.append(f"{w.function}: {UNIQUE_INSERT} needs the migration {migration} (merge existing duplicates "
                         "first; on a busy table, CREATE UNIQUE INDEX CONCURRENTLY)")  # fmt: skip
    return out


def identity(w: Writer, insert: str) -> list[str]:
    """The columns a read of the writer pins to one value each, all of them set by the INSERT."""
    why = "no read before the INSERT looks its row up"
    for read in w.reads:
        try:
            columns = sql_inserts.equality_columns(read.statement)
            sql_inserts.on_conflict_do_nothing(insert, columns)
        except RewriteError as exc:
            why = str(exc)
            continue
        return columns
    raise NotApplicable(f"no unique key to conflict on: {why}")


def _lookup_args(params: cst.BaseExpression | None,
                 values: list[int | exp.Expression]) -> list[cst.BaseExpression] | None:  # fmt: skip
    """The INSERT call's own parameter expressions for the conflict columns (None unless all are placeholders
    bound in a tuple or list literal)."""
    if not isinstance(params, cst.Tuple | cst.List) or not all(isinstance(v, int) for v in values):
        return None
    elements = params.elements
    out = [elements[v].value for v in values if isinstance(v, int) and v < len(elements)]
    return out if len(out) == len(values) else None


def _found_branch(ctx: Context, site: CallSite, note: str) -> list[Op] | None:
    """After the INSERT, what the function's check does when it finds the row (its last one-statement ``if`` before
    the INSERT that returns or raises), if that does not use what the check tested; None otherwise."""
    index, path = ctx.index, site.path
    at = index.position(path, site.call)
    statement = index.statement_of(path, site.call)
    if at is None or statement is None:
        return None
    check: cst.If | None = None
    for node in walk(site.func.body):
        where = index.position(path, node)
        if not isinstance(node, cst.If) or where is None or where.start.line >= at.start.line:
            continue
        body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
        if (
            len(body) == 1
            and isinstance(body[0], cst.SimpleStatementLine)
            and node.orelse is None
            and any(isinstance(n, cst.Return | cst.Raise) for n in walk(body[0]))
        ):
            check = node
    if check is None:
        return None
    tested = {n.value for n in walk(check.test) if isinstance(n, cst.Name)}
    if tested & {n.value for n in walk(check.body) if isinstance(n, cst.Name)}:
        return None  # the branch uses the row it found: hand it the row inserted first instead
    parent = index.parent(path, site.call)
    fetched = isinstance(parent, cst.Attribute) and parent.attr.value == "fetchone"
    fetch = index.parent(path, parent) if fetched and parent is not None else None
    name = assigned_name(index, path, index.parent(path, fetch) if fetch is not None else parent)
    if name is None:
        return None
    test: cst.BaseExpression = (
        cst.Comparison(cst.Name(name), [cst.ComparisonTarget(cst.Is(), cst.Name("None"))])
        if fetched
        else rowcount_is_zero(cst.Name(name))
    )
    assert isinstance(check.body, cst.IndentedBlock)
    branch = cst.If(test=test, body=cst.IndentedBlock([s.deep_clone() for s in check.body.body]))
    text = f"repair({UNIQUE_INSERT}): {note}; then as when the check finds one"
    return [lambda p: p.after(path, statement, "found-branch", branch), lambda p: p.comment(path, statement, text)]
