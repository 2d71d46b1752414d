"""Guarded UPDATEs: the atomic conditional update (the invariant in the WHERE clause) and the optimistic version
check (the version the function read in the WHERE clause).

Without a configured invariant, the atomic update takes the one a decrement implies: the column it decrements in
place stays non-negative (``stock = stock - 1`` is guarded by ``stock >= 1``), which is what the read-then-check
it replaces made sure of (a relative update that only increments has no such bound, and is not guarded).

Either UPDATE may now match no row; :func:`~processors.repair.strategies.no_row.no_row` makes the code handle that
like the check it already has, or explains in a comment that ``fetchone()`` then returns None.
"""

from __future__ import annotations

import keyword
from functools import partial

from sqlglot import exp

from processors.repair import sql_rewrite
from processors.repair.locate import bound_names
from processors.repair.sql_edit import RewriteError, parse
from processors.repair.strategies.base import (
    ATOMIC_UPDATE,
    OPTIMISTIC_VERSION,
    Context,
    NotApplicable,
    Outcome,
    Writer,
    param_values,
    rewrite,
    sql_op,
)
from processors.repair.strategies.no_row import no_row


def atomic_update(ctx: Context, w: Writer) -> Outcome:
    """``UPDATE t SET c = c - 1 WHERE k = %s`` → ``... AND c >= 1`` (from the invariant), "no row" handled."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates:
        raise NotApplicable("no in-place UPDATE to guard")
    out = Outcome()
    for write in updates:
        invariants = ctx.invariants
        if not invariants:
            try:
                invariants = tuple(sql_rewrite.implied_invariants(write.statement))
            except RewriteError as exc:
                raise NotApplicable(f"no invariant configured for the table, and none implied: {exc}") from exc
            out.notes.append(f"{w.function}: {ATOMIC_UPDATE} guards with {' AND '.join(invariants)}, implied by the "
                             "decrement (no invariant is configured for the table)")  # fmt: skip
        edit = rewrite(partial(sql_rewrite.atomic_update, write.statement, invariants))
        for site in ctx.sites(w, write.statement):
            out.ops.append(sql_op(site, write.statement, edit, param_values(site, edit, {})))
            out.ops += no_row(ctx, site, ATOMIC_UPDATE, "no row if the guard fails")
        out.repairs.append(ctx.info(ATOMIC_UPDATE, w, write.statement, edit.after))
        out.rewrote(edit)
    return out


def optimistic_version(ctx: Context, w: Writer) -> Outcome:
    """``UPDATE ... WHERE id = %s`` → ``... AND version = %s`` with the version the function read."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates:
        raise NotApplicable("no UPDATE to check the version in")
    column = next((c for c in ctx.version_columns if _has_column(w, c)), None)
    if column is None:
        raise NotApplicable("no version column in the statements")
    if not column.isidentifier() or keyword.iskeyword(column):
        raise NotApplicable(f"version column {column!r} is not a Python name")
    out = Outcome()
    for write in updates:
        edit = rewrite(partial(sql_rewrite.optimistic, write.statement, column))
        for site in ctx.sites(w, write.statement):
            at = ctx.index.position(site.path, site.call)
            if column not in bound_names(site.func, at, ctx.index, site.path):
                raise NotApplicable(f"no variable {column!r} holds the version read before the UPDATE")
            out.ops.append(sql_op(site, write.statement, edit, param_values(site, edit, {"version": column})))
            out.ops += no_row(ctx, site, OPTIMISTIC_VERSION, "no row if the version changed")
        out.repairs.append(ctx.info(OPTIMISTIC_VERSION, w, write.statement, edit.after))
        out.rewrote(edit)
    return out


def _has_column(w: Writer, column: str) -> bool:
    for access in (*w.writes, *w.reads):
        try:
            tree = parse(access.statement)
        except RewriteError:
            continue
        if any(c.name == column for c in tree.find_all(exp.Column)):
            return True
    return False
