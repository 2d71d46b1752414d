"""Where a writer's SQLAlchemy code issues its statements: the recorded function, the module-level helpers of the
same module it calls (one level: ``_account``, ``_off_call``), and in them the calls that build or run a statement
on a model (``session.get(M, k)``, a ``select(...)`` chain, ``session.add(M(...))``).

Also the small code builders the edits share: an expression's source text, a node parsed back from text, and the
name a module imports a symbol under (an import line added when it has none).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import libcst as cst

from processors.repair.patch import Patch
from processors.repair.source import SourceError, SourceIndex, walk
from processors.repair.strategies.base import NotApplicable, NotThisShape, Writer

_EMPTY = cst.Module(body=[])


@dataclass(frozen=True, slots=True, eq=False)
class Scope:
    """The recorded function and the helpers it calls, as (name, def) of one module."""

    path: Path
    function: cst.FunctionDef
    helpers: tuple[cst.FunctionDef, ...]

    @property
    def defs(self) -> tuple[cst.FunctionDef, ...]:
        return (self.function, *self.helpers)


def scope_of(index: SourceIndex, w: Writer) -> Scope:
    """The writer's function and the module-level functions of its module it calls."""
    try:
        fn = index.function(w.path, w.function)
    except SourceError as exc:
        raise NotApplicable(str(exc)) from exc
    if fn is None:
        raise NotApplicable(f"function {w.function} not found in {w.rel}")
    if not _uses_sqlalchemy(index, w.path):
        raise NotThisShape(f"{w.rel} does not use SQLAlchemy (nor do the local modules it imports from)")
    helpers: list[cst.FunctionDef] = []
    for node in walk(fn.body):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            found = index.local_def(w.path, node.func.value)
            if found is not None and found[0] == w.path and found[1] is not fn and found[1] not in helpers:
                helpers.append(found[1])
    return Scope(w.path, fn, tuple(helpers))


def _uses_sqlalchemy(index: SourceIndex, path: Path) -> bool:
    """Whether the module, or a local module it imports from, imports SQLAlchemy."""
    for file in {path, *(source for source, _ in index.imports(path).values())}:
        try:
            body = index.module(file).body
        except SourceError:
            continue
        for stmt in body:
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
                    if code(small.module).split(".")[0] in ("sqlalchemy", "flask_sqlalchemy"):
                        return True
                elif isinstance(small, cst.Import) and any(
                    code(a.name).split(".")[0] in ("sqlalchemy", "flask_sqlalchemy") for a in small.names
                ):
                    return True
    return False


def code(node: cst.CSTNode) -> str:
    """The source text of ``node``."""
    return _EMPTY.code_for_node(node)


def names(node: cst.CSTNode, name: str) -> bool:
    """Whether ``name`` occurs (as a name) under ``node``."""
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node))


def callee(call: cst.Call) -> str:
    """``f`` for ``f(...)`` and ``x.f(...)``."""
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


def calls(node: cst.CSTNode) -> Iterator[cst.Call]:
    return (n for n in walk(node) if isinstance(n, cst.Call))


def session_gets(fn: cst.FunctionDef, model: str) -> list[cst.Call]:
    """``<session>.get(Model, key, ...)`` calls."""
    return [c for c in calls(fn) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "get" and c.args
            and isinstance(c.args[0].value, cst.Name) and c.args[0].value.value == model]  # fmt: skip


@dataclass(frozen=True, slots=True, eq=False)
class Chain:
    """A ``select(...)`` and the method calls chained on it: ``select(a).select_from(M).where(p)``."""

    outer: cst.Call  # the whole chain
    steps: tuple[tuple[str, cst.Call], ...]  # innermost first: ("select", call), ("where", call), ...

    @property
    def select(self) -> cst.Call:
        return self.steps[0][1]

    def aggregate(self) -> bool:
        """Whether the select's columns call ``func.<aggregate>`` (``func.count()``)."""
        return any(isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == "func"
                   for a in self.select.args for n in walk(a.value))  # fmt: skip


def select_chains(index: SourceIndex, path: Path, fn: cst.FunctionDef, model: str) -> list[Chain]:
    """The ``select(...)`` chains in ``fn`` that name ``model``."""
    out = []
    for call in calls(fn):
        if callee(call) != "select" or (isinstance(call.func, cst.Attribute) and call.func.attr.value != "select"):
            continue
        if isinstance(call.func, cst.Attribute) and not isinstance(call.func.value, cst.Name):
            continue  # x.y.select(...): a method of something else
        steps: list[tuple[str, cst.Call]] = [("select", call)]
        outer = call
        while True:
            attr = index.parent(path, outer)
            up = index.parent(path, attr) if isinstance(attr, cst.Attribute) else None
            if not (isinstance(attr, cst.Attribute) and isinstance(up, cst.Call) and up.func is attr):
                break
            steps.append((attr.attr.value, up))
            outer = up
        if names(outer, model):
            out.append(Chain(outer, tuple(steps)))
    return out


def defining_call(fn: cst.FunctionDef, name: str, model: str) -> cst.Call | None:
    """The ``Model(...)`` call bound to ``name`` in ``fn`` (``booking = Booking(...)``)."""
    for node in walk(fn):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target, value = node.targets[0].target, node.value
            if isinstance(target, cst.Name) and target.value == name and isinstance(value, cst.Call) \
                    and isinstance(value.func, cst.Name) and value.func.value == model:  # fmt: skip
                return value
    return None


def imported_as(index: SourceIndex, path: Path, module: str, name: str) -> str | None:
    """The local name of ``from module import name`` in ``path`` (None when not imported so)."""
    for stmt in index.module(path).body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                continue
            if small.relative or small.module is None or code(small.module) != module:
                continue
            for alias in small.names:
                if isinstance(alias.name, cst.Name) and alias.name.value == name:
                    local = alias.asname.name if alias.asname is not None else alias.name
                    return local.value if isinstance(local, cst.Name) else None
    return None


def _import_from(tree: cst.Module, module: str) -> cst.ImportFrom | None:
    """The module's top-level ``from module import a, b`` (not ``*``, not relative)."""
    for stmt in tree.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None \
                        and code(small.module) == module and not isinstance(small.names, cst.ImportStar):  # fmt: skip
                    return small
    return None


def _with_name(node: cst.CSTNode, *, name: str) -> cst.CSTNode:
    """``from m import A, c`` with ``name`` among its names, in isort's order (capitalised names first)."""
    assert isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar)
    aliases = list(node.names)
    at = next((i for i, a in enumerate(aliases) if (a.evaluated_name[:1].islower(), a.evaluated_name)
               > (name[:1].islower(), name)), len(aliases))  # fmt: skip
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new = cst.ImportAlias(name=cst.Name(name), comma=comma if at < len(aliases) else cst.MaybeSentinel.DEFAULT)
    if at == len(aliases):
        aliases[-1] = aliases[-1].with_changes(comma=comma)
    return node.with_changes(names=[*aliases[:at], new, *aliases[at:]])


def ensure_import(patch: Patch, index: SourceIndex, path: Path, module: str, name: str, alias: str = "") -> str:
    """The local name for ``from module import name`` in ``path``; the import line added (as ``alias`` when
    given) after the module's last top-level import when the module has none."""
    found = imported_as(index, path, module, name)
    if found is not None:
        return found
    line = f"from {module} import {name}" + (f" as {alias}" if alias else "")  # fixed names, never input
    tree = index.module(path)
    existing = _import_from(tree, module)
    if existing is not None and not alias:
        patch.edit(path, existing, f"import {module}:{name}", partial(_with_name, name=name))
        return name

    def add(node: cst.CSTNode) -> cst.CSTNode:
        assert isinstance(node, cst.Module)
        body = list(node.body)
        last = max((i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine)
                    and any(isinstance(x, cst.Import | cst.ImportFrom) for x in s.body)), default=-1)  # fmt: skip
        return node.with_changes(body=[*body[: last + 1], cst.parse_statement(line), *body[last + 1 :]])

    patch.edit(path, tree, f"import {module}:{name}", add)
    return alias or name
