"""Row locks in Django: the queryset the writer reads through gets ``select_for_update()``.

``M.objects.get(...)`` becomes ``M.objects.select_for_update().get(...)`` (likewise ``first()``, ``last()``,
``exists()``). A ``count()`` cannot lock: PostgreSQL refuses ``FOR UPDATE`` next to an aggregate, and Django would
send ``SELECT COUNT(*) ... FOR UPDATE``; the rows counted are locked and counted in Python instead,
``len(<queryset>.select_for_update().values_list("pk"))`` (``SELECT <pk> FROM t WHERE ... FOR UPDATE``): a second
request's locking read waits for the first to commit, then re-evaluates its WHERE on the new row versions.
``select_for_update()`` outside a transaction raises, so the recorded function is decorated
``@transaction.atomic`` when no ``transaction.atomic()`` encloses the read. The SQL-level form is the recorded
statement with ``FOR UPDATE`` (an aggregate over a locking subquery for a count).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import libcst as cst

from processors.repair.django_orm.code import ensure_import, in_transaction, protected
from processors.repair.django_orm.querysets import OrmCall, calls_of, described, functions
from processors.repair.patch import Patch
from processors.repair.strategies.base import ROW_LOCK, Context, NotApplicable, Op, Outcome, Writer, rewrite
from processors.repair.strategies.row_lock import locked

_LOCKABLE = frozenset({"get", "first", "last", "exists", "count"})


def row_lock(ctx: Context, w: Writer) -> Outcome:
    """Each unlocked read before the write through ``select_for_update()``, in a transaction."""
    protected(ctx.index, w)
    if not w.reads:
        raise NotApplicable("no unlocked read precedes the write")
    root = functions(ctx.index, w)[0]
    out = Outcome()
    unprotected = False
    for read in w.reads:
        calls = calls_of(ctx.index, w, read.statement)
        if any(c.method not in _LOCKABLE for c in calls):
            raise NotApplicable(f"{read.statement!r} is not read by get, first, last, exists or count")
        edit = rewrite(partial(locked, read.statement, share=False))
        out.notes += [f"{w.function}: {read.statement!r} is Django's, from {described(ctx.index, oc)}: "
                      f"{ROW_LOCK} reads it through select_for_update()" for oc in calls]  # fmt: skip
        for oc in calls:
            out.ops.append(_lock_op(oc))
            unprotected = unprotected or not in_transaction(ctx.index, root, oc)
        out.repairs.append(ctx.info(ROW_LOCK, w, read.statement, edit.after))
        out.rewrote(edit)
    if unprotected:
        out.ops.append(atomic_op(root[0], root[1]))
        out.notes.append(f"{w.function}: select_for_update() needs a transaction: the function now runs in "
                         "transaction.atomic")  # fmt: skip
    return out


def atomic_op(path: Path, func: cst.FunctionDef) -> Op:
    """Decorate ``func`` ``@transaction.atomic`` (innermost, so it wraps the function's own body)."""

    def decorate(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.FunctionDef)
        decorator = cst.Decorator(decorator=cst.Attribute(value=cst.Name("transaction"), attr=cst.Name("atomic")))
        return node.with_changes(decorators=[*node.decorators, decorator])

    def op(patch: Patch) -> None:
        patch.edit(path, func, "atomic", decorate)
        ensure_import(patch, patch.index, path, "django.db", "transaction")

    return op


def _lock_op(oc: OrmCall) -> Op:
    text = f"repair({ROW_LOCK}): the rows read are locked until the transaction ends; a concurrent writer waits"

    def op(patch: Patch) -> None:
        func = oc.call.func
        assert isinstance(func, cst.Attribute)
        if oc.method == "count":
            patch.edit(oc.path, oc.call, ROW_LOCK, _counted_in_python)
        else:
            patch.edit(oc.path, func, ROW_LOCK, _select_for_update)
        statement = patch.index.statement_of(oc.path, oc.call)
        if statement is not None:
            patch.comment(oc.path, statement, text)

    return op


def _select_for_update(node: cst.CSTNode) -> cst.CSTNode:
    """``<qs>.get`` → ``<qs>.select_for_update().get``."""
    assert isinstance(node, cst.Attribute)
    locked = cst.Call(func=cst.Attribute(value=node.value, attr=cst.Name("select_for_update")))
    return node.with_changes(value=locked)


def _counted_in_python(node: cst.CSTNode) -> cst.CSTNode:
    """``<qs>.count()`` → ``len(<qs>.select_for_update().values_list("pk"))``."""
    assert isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
    locked = cst.Call(func=cst.Attribute(value=node.func.value, attr=cst.Name("select_for_update")))
    keys = cst.Call(func=cst.Attribute(value=locked, attr=cst.Name("values_list")),
                    args=[cst.Arg(cst.SimpleString('"pk"'))])  # fmt: skip
    return cst.Call(func=cst.Name("len"), args=[cst.Arg(keys)])
