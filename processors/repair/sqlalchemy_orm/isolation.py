"""Stricter isolation in SQLAlchemy code: the writer's ``with <session>, <session>.begin():`` block runs at
SERIALIZABLE, retried (at most three times) when PostgreSQL aborts it with a serialization failure.

The level is set on the transaction's connection as its first act, ``session.connection(execution_options=
{"isolation_level": "SERIALIZABLE"})`` (SQLAlchemy applies it when the transaction checks its connection out, and
resets it when the connection goes back to the pool), so the session's factory and the engine stay as they are
for every other caller. A serialization failure reaches the code as ``sqlalchemy.exc.OperationalError`` whose
driver error has SQLSTATE 40001 (``sqlstate`` in psycopg 3, ``pgcode`` in psycopg2); anything else is re-raised.
The SQL-level form is ``BEGIN ISOLATION LEVEL SERIALIZABLE``.
"""

from __future__ import annotations

from typing import Final

import libcst as cst

from processors.repair import sql_rewrite
from processors.repair.edits import LOOP_NAMES
from processors.repair.patch import Patch
from processors.repair.source import walk
from processors.repair.sqlalchemy_orm.calls import Scope, callee, ensure_import, scope_of
from processors.repair.strategies.base import STRICTER_ISOLATION, Context, NotApplicable, Op, Outcome, Writer

_RETRY: Final = """\
for attempt in range(3):  # repair(stricter_isolation): SERIALIZABLE; a serialization failure is retried
    try:
        pass
        break
    except OperationalError as exc:
        if attempt == 2 or getattr(exc.orig, "sqlstate", getattr(exc.orig, "pgcode", None)) != "40001":
            raise
"""


def stricter_isolation(ctx: Context, w: Writer) -> Outcome:
    """Run the writer's session transaction at SERIALIZABLE, retried on a serialization failure."""
    scope = scope_of(ctx.index, w)
    block, session = _transaction(scope)
    taken = {n.value for n in walk(scope.function) if isinstance(n, cst.Name)}
    var = next((n for n in LOOP_NAMES if n not in taken), None)
    if var is None or ("exc" in taken and "OperationalError" not in taken):
        raise NotApplicable("no free name for the retry loop")
    out = Outcome()
    out.ops.append(_retry_op(ctx, scope, block, session, var))
    for access in w.writes:
        out.repairs.append(ctx.info(STRICTER_ISOLATION, w, access.statement, access.statement))
    out.sql.append(dict(sql_rewrite.SERIALIZABLE_BEGIN))
    out.isolation[w.function] = "serializable"
    out.notes.append(f"{w.function}: {STRICTER_ISOLATION}: its `with {session}.begin()` block runs at "
                     "SERIALIZABLE (session.connection(execution_options=...)), retried on SQLSTATE 40001 at most "
                     "3 times")  # fmt: skip
    return out


def _transaction(scope: Scope) -> tuple[cst.With, str]:
    """The function's one ``with ... <session>.begin():`` block, and the session's name."""
    found = []
    for node in walk(scope.function):
        if not isinstance(node, cst.With):
            continue
        for item in node.items:
            call = item.item
            if isinstance(call, cst.Call) and callee(call) == "begin" and isinstance(call.func, cst.Attribute) \
                    and isinstance(call.func.value, cst.Name):  # fmt: skip
                found.append((node, call.func.value.value))
    if len(found) != 1:
        raise NotApplicable(f"{len(found)} `with <session>.begin():` blocks in {scope.function.name.value}")
    block, session = found[0]
    if not isinstance(block.body, cst.IndentedBlock):
        raise NotApplicable("the transaction block is on one line")
    return block, session


def _retry_op(ctx: Context, scope: Scope, block: cst.With, session: str, var: str) -> Op:
    def op(patch: Patch) -> None:
        error = ensure_import(patch, ctx.index, scope.path, "sqlalchemy.exc", "OperationalError")
        setup = cst.parse_statement(
            f'{session}.connection(execution_options={{"isolation_level": "SERIALIZABLE"}})\n'
        )  # the session's name comes from the code; the rest is fixed
        loop = cst.parse_statement(_RETRY.replace("attempt", var).replace("OperationalError", error))
        assert isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)

        def wrap(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.With) and isinstance(node.body, cst.IndentedBlock)
            inner = node.with_changes(leading_lines=(), body=node.body.with_changes(body=[setup, *node.body.body]))
            attempt = loop.body.body[0]
            assert isinstance(attempt, cst.Try) and isinstance(attempt.body, cst.IndentedBlock)
            attempt = attempt.with_changes(body=attempt.body.with_changes(body=[inner, attempt.body.body[1]]))
            return loop.with_changes(body=loop.body.with_changes(body=[attempt]), leading_lines=node.leading_lines)

        patch.edit(scope.path, block, "stricter_isolation", wrap)

    return op
