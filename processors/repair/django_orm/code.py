"""What the Django strategies share in the code: the ``transaction.atomic()`` around a call, names to import, and
comments on new statements.

A call runs in a transaction when it is inside a ``with transaction.atomic(...)`` block (or ``with atomic(...)``)
of its function, when its function is decorated ``@transaction.atomic``, or, for a helper, when every call of the
helper in the recorded function does. A name the repair needs (``from django.db import IntegrityError``) is added to
the module's ``from <module> import ...`` when it has one, else as a new line after its last import.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from processors.repair.django_orm.querysets import OrmCall, calls_of, functions, locking_tables, orm_calls, shape
from processors.repair.edits import comment_lines
from processors.repair.patch import Patch
from processors.repair.source import SourceIndex, dotted, walk
from processors.repair.strategies.base import NotApplicable, NotThisShape, Writer


def is_atomic(node: cst.BaseExpression) -> bool:
    """``transaction.atomic``, ``atomic``, or a call of either."""
    if isinstance(node, cst.Call):
        node = node.func
    if isinstance(node, cst.Name):
        return node.value == "atomic"
    return isinstance(node, cst.Attribute) and node.attr.value == "atomic"


def atomic_block(index: SourceIndex, path: Path, node: cst.CSTNode) -> cst.With | None:
    """The innermost ``with ...atomic(...)`` block of the function that holds ``node``."""
    current = index.parent(path, node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        if isinstance(current, cst.With) and any(is_atomic(i.item) for i in current.items):
            return current
        current = index.parent(path, current)
    return None


def outer_atomic_block(index: SourceIndex, path: Path, node: cst.CSTNode) -> cst.With | None:
    """The outermost ``with ...atomic(...)`` block of the function that holds ``node``."""
    found = None
    current = index.parent(path, node)
    while current is not None and not isinstance(current, cst.FunctionDef):
        if isinstance(current, cst.With) and any(is_atomic(i.item) for i in current.items):
            found = current
        current = index.parent(path, current)
    return found


def decorated_atomic(func: cst.FunctionDef) -> bool:
    return any(is_atomic(d.decorator) for d in func.decorators)


def entry_nodes(index: SourceIndex, root: tuple[Path, cst.FunctionDef], oc: OrmCall) -> list[cst.CSTNode]:
    """Where the recorded function runs ``oc``: the call itself, or the calls of the helper that holds it."""
    if oc.func is root[1]:
        return [oc.call]
    name = oc.func.name.value
    return [n for n in walk(root[1].body) if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
            and n.func.value == name]  # fmt: skip


def in_transaction(index: SourceIndex, root: tuple[Path, cst.FunctionDef], oc: OrmCall) -> bool:
    """Whether ``oc`` always runs inside a transaction the code opens."""
    if decorated_atomic(oc.func) or atomic_block(index, oc.path, oc.call) is not None:
        return True
    if oc.func is root[1]:
        return False
    if decorated_atomic(root[1]):
        return True
    calls = entry_nodes(index, root, oc)
    return bool(calls) and all(atomic_block(index, root[0], c) is not None for c in calls)


def imported(index: SourceIndex, path: Path, module: str, name: str) -> bool:
    """Whether ``path`` has ``from <module> import <name>`` at module level."""
    return _from_import(index, path, module, name)[1]


def ensure_import(patch: Patch, index: SourceIndex, path: Path, module: str, name: str) -> None:
    """``from <module> import <name>`` in ``path`` (added to an existing ``from <module> import`` line)."""
    statement, present = _from_import(index, path, module, name)
    if present:
        return
    if statement is not None:
        patch.edit(path, statement, f"import:{module}:{name}", lambda node: _add_alias(node, name))
        return
    body = index.module(path).body
    imports = [s for s in body if isinstance(s, cst.SimpleStatementLine)
               and any(isinstance(x, cst.Import | cst.ImportFrom) for x in s.body)]  # fmt: skip
    if not imports:
        raise ValueError(f"{path}: no import to add `from {module} import {name}` after")
    new = cst.parse_statement(f"from {module} import {name}")  # fixed module and class names, never input
    patch.after(path, imports[-1], f"import:{module}:{name}", new)


def _from_import(index: SourceIndex, path: Path, module: str, name: str) -> tuple[cst.ImportFrom | None, bool]:
    first: cst.ImportFrom | None = None
    for stmt in index.module(path).body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.ImportFrom) or small.relative or dotted(small.module) != module:
                continue
            if isinstance(small.names, cst.ImportStar):
                return small, True
            if any(a.asname is None and isinstance(a.name, cst.Name) and a.name.value == name for a in small.names):
                return small, True
            first = first or small
    return first, False


def _add_alias(node: cst.CSTNode, name: str) -> cst.CSTNode:
    """The ``from m import a, b`` statement with ``name`` added, in sorted place."""
    assert isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar)
    names = list(node.names)
    if any(isinstance(a.name, cst.Name) and a.name.value == name for a in names):
        return node
    at = next((i for i, a in enumerate(names) if isinstance(a.name, cst.Name) and a.name.value > name), len(names))
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last_comma = names[-1].comma
    names = [a.with_changes(comma=comma) for a in names]
    names.insert(at, cst.ImportAlias(name=cst.Name(name), comma=comma))
    names[-1] = names[-1].with_changes(comma=last_comma)
    return node.with_changes(names=names)


def commented(
    index: SourceIndex, path: Path, original: cst.CSTNode, node: cst.BaseCompoundStatement, text: str, width: int
) -> cst.BaseCompoundStatement:
    """``node`` (replacing the statement ``original``) with the original's leading lines and ``# text``."""
    where = index.position(path, original)
    column = where.start.column if where is not None else 0
    leading = (
        original.leading_lines if isinstance(original, cst.SimpleStatementLine | cst.BaseCompoundStatement) else ()
    )
    return node.with_changes(leading_lines=[*leading, *comment_lines(text, column, width)])


def protected(index: SourceIndex, w: Writer) -> None:
    """Refuse a writer whose code has no Django queryset (:class:`NotThisShape`), or is already protected: it runs
    SERIALIZABLE with a retry (it, or a helper it calls, handles ``SerializationFailure`` or names
    ``SERIALIZABLE``), it reads the table through ``select_for_update()``, or its ``create()`` handles
    ``IntegrityError`` (a unique constraint decides)."""
    if next(orm_calls(index, w), None) is None:
        raise NotThisShape(f"no Django queryset in {w.function} ({w.rel})")
    for _, func in functions(index, w):
        for node in walk(func):
            if (isinstance(node, cst.Name) and node.value == "SerializationFailure") or (
                isinstance(node, cst.Attribute) and node.attr.value in ("SerializationFailure", "SERIALIZABLE")
            ):
                raise NotApplicable(f"{w.function} retries serialization failures (it runs SERIALIZABLE): already "
                                    "protected")  # fmt: skip
    tables = {shape(a.statement).table for a in (*w.reads, *w.writes)}
    locked = tables & locking_tables(index, w)
    if locked:
        raise NotApplicable(f"{w.function} reads {', '.join(sorted(locked))} through select_for_update(): already "
                            "protected")  # fmt: skip
    for insert in (a for a in w.writes if a.operation == "insert"):
        for oc in calls_of(index, w, insert.statement):
            if guarded(index, oc):
                raise NotApplicable(f"the create() in {oc.func.name.value} handles IntegrityError (a unique "
                                    "constraint decides): already protected")  # fmt: skip


def guarded(index: SourceIndex, oc: OrmCall) -> bool:
    """Whether the call runs in a ``try`` (of its function) that handles ``IntegrityError``."""
    node = index.parent(oc.path, oc.call)
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.Try) and any(
            isinstance(n, cst.Name | cst.Attribute) and _last_name(n) == "IntegrityError"
            for h in node.handlers
            if h.type is not None
            for n in walk(h.type)
        ):
            return True
        node = index.parent(oc.path, node)
    return False


def _last_name(node: cst.Name | cst.Attribute) -> str:
    return node.value if isinstance(node, cst.Name) else node.attr.value
