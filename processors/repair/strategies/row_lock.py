"""Row locks: the writer's unlocked read becomes ``SELECT ... FOR UPDATE``, so the write sees no stale row; a reader's
reads become ``FOR SHARE``, so no writer changes what it read before it is done.

An aggregate read (``SELECT count(*) FROM t WHERE p``, a write skew's check) cannot carry the lock itself; it reads
the rows through a subquery that locks them (:func:`~processors.repair.sql_rewrite.locked_aggregate`).
"""

from __future__ import annotations

from functools import partial

from processors.repair import sql_rewrite
from processors.repair.sql_edit import RewriteError, SqlEdit
from processors.repair.strategies.base import (
    ROW_LOCK,
    SHARE_LOCK,
    Context,
    NotApplicable,
    Outcome,
    Writer,
    rewrite,
    sql_op,
)


def row_lock(ctx: Context, w: Writer) -> Outcome:
    """The unlocked read before the write becomes ``SELECT ... FOR UPDATE``."""
    return _locked(ctx, w, ROW_LOCK, share=False)


def share_lock(ctx: Context, w: Writer) -> Outcome:
    """The reader's unlocked reads become ``SELECT ... FOR SHARE``: a writer of those rows waits until it is done."""
    return _locked(ctx, w, SHARE_LOCK, share=True)


def _locked(ctx: Context, w: Writer, strategy: str, *, share: bool) -> Outcome:
    if not w.reads:
        raise NotApplicable("no unlocked read precedes the write")
    out = Outcome()
    for read in w.reads:
        edit = rewrite(partial(locked, read.statement, share=share))
        out.ops += [sql_op(site, read.statement, edit, []) for site in ctx.sites(w, read.statement)]
        out.repairs.append(ctx.info(strategy, w, read.statement, edit.after))
        out.rewrote(edit)
    return out


def locked(statement: str, *, share: bool) -> SqlEdit:
    """The statement with its rows locked: the lock clause, or for an aggregate, a subquery that locks them."""
    try:
        return sql_rewrite.row_lock(statement, share=share)
    except RewriteError as refused:
        try:
            return sql_rewrite.locked_aggregate(statement, share=share)
        except RewriteError:
            raise refused from None
