"""Stricter isolation in Django: the writer's ``transaction.atomic()`` block runs at SERIALIZABLE, retried.

Django sets an isolation level per database alias (``OPTIONS["isolation_level"]``), for every transaction on it;
the repair is local instead: the block's first statement is ``SET TRANSACTION ISOLATION LEVEL SERIALIZABLE`` on
its connection (``transaction.get_connection(<the block's using>)``), which PostgreSQL accepts as the first
statement of the transaction Django's ``atomic()`` opened. PostgreSQL aborts one of two conflicting transactions
with a serialization failure, which Django raises as ``OperationalError`` caused by psycopg's
``SerializationFailure`` (at any statement, or at the commit); the block then runs again, at most three times, as
the stack's own serializable control does. The outermost ``atomic()`` of the recorded function that runs the write
is the block (the SET must open the transaction, not a savepoint). The SQL-level form is ``BEGIN ISOLATION LEVEL
SERIALIZABLE`` for the recorded function.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Final

import libcst as cst

from processors.repair import sql_rewrite
from processors.repair.django_orm.code import (
    commented,
    decorated_atomic,
    ensure_import,
    entry_nodes,
    outer_atomic_block,
    protected,
)
from processors.repair.django_orm.querysets import calls_of, functions
from processors.repair.edits import LOOP_NAMES, names_in
from processors.repair.patch import Patch
from processors.repair.source import SourceIndex, walk
from processors.repair.strategies.base import STRICTER_ISOLATION, Context, NotApplicable, Op, Outcome, Writer

_RETRY: Final = """\
for ATTEMPT in range(3):
    try:
        pass
        break
    except OperationalError as ERROR:
        if ATTEMPT == 2 or not isinstance(ERROR.__cause__, SerializationFailure):
            raise
"""
_SET: Final = """\
with transaction.get_connection().cursor() as CURSOR:
    CURSOR.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
"""


def stricter_isolation(ctx: Context, w: Writer) -> Outcome:
    """Run the writer's ``atomic()`` block at SERIALIZABLE, retried on a serialization failure."""
    protected(ctx.index, w)
    root = functions(ctx.index, w)[0]
    if decorated_atomic(root[1]):
        raise NotApplicable(f"{w.function} is decorated atomic: the retry must be outside the transaction")
    blocks: dict[int, cst.With] = {}
    for access in w.writes:
        for oc in calls_of(ctx.index, w, access.statement):
            for node in entry_nodes(ctx.index, root, oc):
                block = outer_atomic_block(ctx.index, root[0], node)
                if block is None:
                    raise NotApplicable(f"no `with transaction.atomic():` block around the write in {w.function}")
                blocks[id(block)] = block
    if not blocks:
        raise NotApplicable(f"no write of {w.function} to run at SERIALIZABLE")
    out = Outcome()
    out.notes.append(
        f"{w.function}: its writes are Django's, in `with transaction.atomic()`: {STRICTER_ISOLATION} "
        "runs that block at SERIALIZABLE, retried on a serialization failure"
    )
    for block in blocks.values():
        out.ops.append(_retry_op(ctx.index, root[0], root[1], block))
    for access in w.writes:
        out.repairs.append(ctx.info(STRICTER_ISOLATION, w, access.statement, access.statement))
    out.sql.append(dict(sql_rewrite.SERIALIZABLE_BEGIN))
    out.isolation[w.function] = "serializable"
    return out


def _retry_op(index: SourceIndex, path: Path, func: cst.FunctionDef, block: cst.With) -> Op:
    text = f"repair({STRICTER_ISOLATION}): SERIALIZABLE; a transaction aborted by a conflict is retried"
    taken = {n.value for n in names_in(func)}
    var = next((n for n in LOOP_NAMES if n not in taken), None)
    error = next((n for n in ("exc", "error", "_exc") if n not in taken), None)
    cursor = next((n for n in ("cursor", "_cursor", "set_cursor") if n not in taken), None)
    if var is None or error is None or cursor is None:
        raise NotApplicable("no free names for the retry loop")
    using = next((a.value for i in block.items if isinstance(i.item, cst.Call) for a in i.item.args
                  if a.keyword is not None and a.keyword.value == "using"), None)  # fmt: skip

    driver = "psycopg2" if _imports_psycopg2(index, path) else "psycopg"  # whose SerializationFailure Django wraps

    def retried(node: cst.CSTNode, *, width: int) -> cst.CSTNode:
        assert isinstance(node, cst.With) and isinstance(node.body, cst.IndentedBlock)
        inner = node.with_changes(leading_lines=(), body=node.body.with_changes(body=[_setup(cursor, using),
                                                                                      *node.body.body]))  # fmt: skip
        loop = cst.parse_statement(_RETRY.replace("ATTEMPT", var).replace("ERROR", error))  # names of fixed lists
        assert isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)
        attempt = loop.body.body[0]
        assert isinstance(attempt, cst.Try) and isinstance(attempt.body, cst.IndentedBlock)
        attempt = attempt.with_changes(body=attempt.body.with_changes(body=[inner, attempt.body.body[1]]))
        loop = loop.with_changes(body=loop.body.with_changes(body=[attempt]))
        return commented(index, path, block, loop, text, width)

    def op(patch: Patch) -> None:
        patch.edit(path, block, STRICTER_ISOLATION, partial(retried, width=patch.line_length))
        ensure_import(patch, patch.index, path, "django.db", "OperationalError")
        ensure_import(patch, patch.index, path, "django.db", "transaction")
        ensure_import(patch, patch.index, path, f"{driver}.errors", "SerializationFailure")

    return op


def _setup(cursor: str, using: cst.BaseExpression | None) -> cst.With:
    """``with transaction.get_connection([using]).cursor() as <cursor>: <cursor>.execute("SET TRANSACTION ...")``."""
    setup = cst.parse_statement(_SET.replace("CURSOR", cursor))  # a fixed template and a name of a fixed list
    assert isinstance(setup, cst.With)
    if using is None:
        return setup
    item = setup.items[0]
    call = item.item
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Call)
    connection = call.func.value.with_changes(args=[cst.Arg(using.deep_clone())])
    return setup.with_changes(items=[item.with_changes(item=call.with_changes(
        func=call.func.with_changes(value=connection)))])  # fmt: skip


def _imports_psycopg2(index: SourceIndex, path: Path) -> bool:
    """Whether the module names psycopg2 (Django's older PostgreSQL driver) rather than psycopg (3)."""
    return any(isinstance(n, cst.Name) and n.value == "psycopg2" for n in walk(index.module(path)))
