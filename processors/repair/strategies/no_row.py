"""The "no row updated" path of a guarded UPDATE: reuse the code's own missing-row handling, or add it.

A guarded UPDATE (atomic or optimistic) matches no row when the guard fails. If the code already handles a missing
row after it (``if row is None: raise``, or a local helper that raises or returns when its first argument is None),
a comment says so. Otherwise a check is added right after the statement (``if row is None`` on a fetched row,
``if cur.rowcount == 0`` on a cursor) whose body is a clone of the function's last simple check that ends the
request before the UPDATE (``raise OutOfStock(...)``), else a ``LookupError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import libcst as cst

from processors.repair.edits import string_literal
from processors.repair.locate import CallSite
from processors.repair.source import SourceIndex, walk
from processors.repair.strategies.base import Context, NotApplicable, Op


def no_row(ctx: Context, site: CallSite, strategy: str, why: str) -> list[Op]:
    """A guarded UPDATE may match no row: reuse the code's missing-row handling, or add it; explain in a comment."""
    path, index = site.path, ctx.index
    statement = index.statement_of(path, site.call)
    if statement is None:
        raise NotApplicable("the UPDATE is not inside a statement")
    head = f"repair({strategy}): {why}"
    parent = index.parent(path, site.call)
    handled: str | None = None
    subject: cst.BaseExpression | None = None
    fetched = False
    if isinstance(parent, cst.Attribute) and parent.attr.value == "fetchone":
        fetch = index.parent(path, parent)
        holder = index.parent(path, fetch) if fetch is not None else None
        if isinstance(holder, cst.Arg):
            call = index.parent(path, holder)
            if isinstance(call, cst.Call) and call.args and call.args[0] is holder:
                handled = _none_checker(index, path, call.func)
        else:
            name = assigned_name(index, path, holder)
            if name is not None:
                handled = _later_check(index, path, statement, name, fetched=True)
                subject, fetched = cst.Name(name), True
    else:
        name = assigned_name(index, path, parent)
        if name is not None:
            handled = _later_check(index, path, statement, name, fetched=False)
            subject = cst.Name(name)
        elif isinstance(parent, cst.Expr):
            subject = site.receiver
    if handled is not None:
        text = f"{head}; {handled} already handles the None"
        return [lambda p: p.comment(path, statement, text)]
    if subject is None:
        return [lambda p: p.comment(path, statement, f"{head}; fetchone() then returns None")]
    test = _is_none(subject) if fetched else rowcount_is_zero(subject)
    check = cst.If(test=test, body=cst.IndentedBlock(_missing_row_handler(index, site)))
    text = f"{head}; handled below like the failed check"
    return [lambda p: p.after(path, statement, "no-row", check), lambda p: p.comment(path, statement, text)]


def assigned_name(index: SourceIndex, path: Path, node: cst.CSTNode | None) -> str | None:
    """The one plain name ``node`` assigns to, when it is such an assignment (``row = ...``)."""
    if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
        return node.targets[0].target.value
    return None


def rowcount_is_zero(subject: cst.BaseExpression) -> cst.Comparison:
    """``subject.rowcount == 0``."""
    rowcount = cst.Attribute(value=subject.deep_clone(), attr=cst.Name("rowcount"))
    return cst.Comparison(rowcount, [cst.ComparisonTarget(cst.Equal(), cst.Integer("0"))])


def _none_checker(index: SourceIndex, path: Path, func: cst.BaseExpression) -> str | None:
    """``name()`` when ``func`` names a local helper that raises or returns when its first argument is None."""
    if not isinstance(func, cst.Name):
        return None
    found = index.local_def(path, func.value)
    if found is None or not found[1].params.params:
        return None
    first = found[1].params.params[0].name.value
    for node in walk(found[1].body):
        if isinstance(node, cst.If) and _tests_none(node.test, first) and _exits(node):
            return f"{func.value}()"
    return None


def _later_check(index: SourceIndex, path: Path, statement: cst.CSTNode, name: str, *, fetched: bool) -> str | None:
    """How the statements after ``statement`` handle ``name`` being no row: a helper, or ``if name is None``."""
    block = index.parent(path, statement)
    body = getattr(block, "body", ())
    if not isinstance(body, Sequence) or statement not in body:
        return None
    for later in body[list(body).index(statement) + 1 :]:
        for node in walk(later):
            if isinstance(node, cst.If) and fetched and _tests_none(node.test, name) and _exits(node):
                return f"the `if {name} is None` check"
            if isinstance(node, cst.Call) and node.args and _refers(node.args[0].value, name, fetched):
                checker = _none_checker(index, path, node.func)
                if checker is not None:
                    return checker
    return None


def _refers(node: cst.BaseExpression, name: str, fetched: bool) -> bool:
    if fetched:
        return isinstance(node, cst.Name) and node.value == name
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "fetchone"
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == name
    )


def _tests_none(test: cst.BaseExpression, name: str) -> bool:
    """``name is None`` or ``not name``, exactly."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return isinstance(test.expression, cst.Name) and test.expression.value == name
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == name
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    )


def _exits(node: cst.If) -> bool:
    return any(isinstance(n, cst.Raise | cst.Return) for n in walk(node.body))


def _missing_row_handler(index: SourceIndex, site: CallSite) -> list[cst.BaseStatement]:
    """The body of the check before the statement that ends the request (``raise OutOfStock(...)``), cloned."""
    at = index.position(site.path, site.call)
    best: cst.If | None = None
    for node in walk(site.func.body):
        if not isinstance(node, cst.If) or not isinstance(node.body, cst.IndentedBlock):
            continue
        where = index.position(site.path, node)
        body = node.body.body
        simple = len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine)
        if simple and _exits(node) and where is not None and at is not None and where.start.line < at.start.line:
            best = node
    if best is not None:
        assert isinstance(best.body, cst.IndentedBlock)
        return [s.deep_clone() for s in best.body.body]
    fallback = string_literal("no row matched: a concurrent transaction changed it first")
    raise_ = cst.Raise(exc=cst.Call(func=cst.Name("LookupError"), args=[cst.Arg(fallback)]))
    return [cst.SimpleStatementLine([raise_])]


def _is_none(subject: cst.BaseExpression) -> cst.Comparison:
    return cst.Comparison(subject.deep_clone(), [cst.ComparisonTarget(cst.Is(), cst.Name("None"))])
