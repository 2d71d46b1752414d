"""Stricter isolation: the writer's ``with ....transaction():`` block runs at SERIALIZABLE (or, for a reader that
must see one snapshot, REPEATABLE READ), in a retry loop.

The block's first statement sets the isolation level (on the block's cursor, else its connection; awaited in an
``async with``); PostgreSQL aborts one of two conflicting transactions with a serialization failure, and the loop
runs the block again, at most three times. The SQL-level equivalent is ``BEGIN ISOLATION LEVEL SERIALIZABLE``
(``REPEATABLE READ``). A code path that only reads (the reader of a read skew) gets its reads' block.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import libcst as cst

from processors.repair import sql_rewrite
from processors.repair.edits import string_literal
from processors.repair.locate import CallSite
from processors.repair.patch import Patch
from processors.repair.source import SourceError, SourceIndex, string_value, walk
from processors.repair.strategies.base import (
    REPEATABLE_READ,
    STRICTER_ISOLATION,
    Context,
    NotApplicable,
    Op,
    Outcome,
    Writer,
)

# strategy -> (the level as SQL, as the repro names it, the SQL-level rewrite of BEGIN)
_LEVELS: Final = {
    STRICTER_ISOLATION: ("SERIALIZABLE", "serializable", sql_rewrite.SERIALIZABLE_BEGIN),
    REPEATABLE_READ: ("REPEATABLE READ", "repeatable_read", sql_rewrite.REPEATABLE_READ_BEGIN),
}


def stricter_isolation(ctx: Context, w: Writer) -> Outcome:
    """Run the writer's transaction at SERIALIZABLE, retried when PostgreSQL aborts it on a conflict."""
    return _isolated(ctx, w, STRICTER_ISOLATION)


def repeatable_read(ctx: Context, w: Writer) -> Outcome:
    """Run the code path's transaction at REPEATABLE READ (one snapshot for all its reads), retried likewise."""
    return _isolated(ctx, w, REPEATABLE_READ)


def _isolated(ctx: Context, w: Writer, strategy: str) -> Outcome:
    level, name, begin = _LEVELS[strategy]
    out = Outcome()
    text = f"repair({strategy}): {level}; a transaction aborted by a conflict is retried"
    what = "write" if w.writes else "read"
    for access in w.writes or w.reads:
        for site in ctx.sites(w, access.statement):
            block = _transaction(ctx.index, site)
            if block is None:
                raise NotApplicable(f"no `with ....transaction():` block around the {what} in {w.function}")
            setup = _set_level(block, level)
            out.ops.append(_retry_op(site.path, block, setup, text))
        out.repairs.append(ctx.info(strategy, w, access.statement, access.statement))
    out.sql.append(dict(begin))
    out.isolation[w.function] = name
    return out


def runs_serializable(index: SourceIndex, path: Path, qualname: str) -> bool:
    """Whether the recorded function sets SERIALIZABLE itself (``SET TRANSACTION ISOLATION LEVEL SERIALIZABLE``, as
    this strategy writes it, ``IsolationLevel.SERIALIZABLE``, or SQLAlchemy's ``isolation_level="SERIALIZABLE"``):
    PostgreSQL then aborts a transaction of every anomaly class, there is nothing to repair."""
    try:
        func = index.function(path, qualname)
    except SourceError:
        return False  # the strategies say why they cannot repair it
    if func is None:
        return False
    for node in walk(func):
        if isinstance(node, cst.Attribute) and node.attr.value == "SERIALIZABLE":
            return True
        text = string_value(node) if isinstance(node, cst.BaseExpression) else None
        if text is not None and "ISOLATION LEVEL SERIALIZABLE" in " ".join(text.upper().split()):
            return True
        if _sqlalchemy_level(node) == "SERIALIZABLE":
            return True
    return False


def _sqlalchemy_level(node: cst.CSTNode) -> str | None:
    """The level SQLAlchemy is told to run at: ``isolation_level="..."`` (``execution_options``,
    ``create_engine``) or ``{"isolation_level": "..."}`` (``session.connection(execution_options=...)``)."""
    keyed = isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == "isolation_level"
    entry = isinstance(node, cst.DictElement) and string_value(node.key) == "isolation_level"
    if not (keyed or entry):
        return None
    assert isinstance(node, cst.Arg | cst.DictElement)
    value = string_value(node.value)
    return " ".join(value.upper().split()) if value is not None else None


def _retry_op(path: Path, block: cst.With, setup: cst.BaseStatement, text: str) -> Op:
    def op(patch: Patch) -> None:
        patch.retry(path, block, setup, text)

    return op


def _transaction(index: SourceIndex, site: CallSite) -> cst.With | None:
    """The ``with x.transaction(...)`` block in the recorded function that runs the statement."""
    node: cst.CSTNode | None = site.chain[0] if site.chain else site.call
    path = site.entry_path
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.With) and any(_is_call_to(i.item, "transaction") for i in node.items):
            return node if isinstance(node.body, cst.IndentedBlock) else None
        node = index.parent(path, node)
    return None


def _is_call_to(node: cst.BaseExpression, method: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method


def _set_level(block: cst.With, level: str) -> cst.BaseStatement:
    """``cur.execute("SET TRANSACTION ISOLATION LEVEL <level>")`` on the block's cursor, else its connection."""
    receiver: cst.BaseExpression | None = None
    for item in block.items:
        if _is_call_to(item.item, "cursor") and item.asname is not None and isinstance(item.asname.name, cst.Name):
            receiver = item.asname.name
            break
    if receiver is None:
        call = next(i.item for i in block.items if _is_call_to(i.item, "transaction"))
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        receiver = call.func.value
    execute: cst.BaseExpression = cst.Call(
        func=cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("execute")),
        args=[cst.Arg(string_literal(f"SET TRANSACTION ISOLATION LEVEL {level}"))],  # a level of _LEVELS
    )
    if block.asynchronous is not None:  # psycopg's AsyncConnection / AsyncCursor
        execute = cst.Await(expression=execute)
    return cst.SimpleStatementLine([cst.Expr(execute)])
