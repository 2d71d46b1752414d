"""The service's source as libcst trees, parsed once per planning: definitions, constants, imports and their uses.

A :class:`SourceIndex` reads each file once and keeps its bytes (patches are rendered against them and diffs are
taken from them), its libcst tree, and on demand each node's parent and source position. Lookups stay at module
level: a recorded function name (``shop.handlers.capture_payment``) names a ``def`` in the recorded file (a method
when the second-to-last part names a class there); ``NAME = <expr>`` bindings are the module's constants (a name
bound twice is none); ``from m import X as Y`` is followed to ``m``'s file when it lies under the root.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

_NOT_A_USE: Final = (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.AsName, cst.AssignTarget)


class SourceError(Exception):
    """A source file that cannot be read or parsed."""


@dataclass(frozen=True, slots=True, eq=False)
class Constant:
    """A module-level ``NAME = "..."`` string constant."""

    path: Path
    name: str
    node: cst.SimpleString


class _Parents(cst.CSTVisitor):
    def __init__(self) -> None:
        self.parents: dict[int, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every node under ``node`` (itself included), depth first, in source order."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.children))


def string_value(node: cst.BaseExpression) -> str | None:
    """The value of a plain (not bytes, not f-) string literal."""
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


class SourceIndex:
    """The parsed modules of one planning (one libcst tree per file, shared by every plan) and lookups over them."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._data: dict[Path, bytes] = {}
        self._modules: dict[Path, cst.Module] = {}
        self._parents: dict[Path, dict[int, cst.CSTNode]] = {}
        self._positions: dict[Path, Mapping[cst.CSTNode, CodeRange]] = {}
        self._constants: dict[Path, dict[str, cst.BaseExpression]] = {}
        self._imports: dict[Path, dict[str, tuple[Path, str]]] = {}

    # -- files -----------------------------------------------------------------------------------------------
    def data(self, path: Path) -> bytes:
        if path not in self._data:
            self._data[path] = path.read_bytes()
        return self._data[path]

    def module(self, path: Path) -> cst.Module:
        """The libcst tree of ``path``; SourceError when it cannot be read or parsed."""
        if path not in self._modules:
            try:
                self._modules[path] = cst.parse_module(self.data(path))
            except (OSError, cst.ParserSyntaxError) as exc:
                raise SourceError(f"{path}: {exc}") from exc
        return self._modules[path]

    def parent(self, path: Path, node: cst.CSTNode) -> cst.CSTNode | None:
        if path not in self._parents:
            visitor = _Parents()
            self.module(path).visit(visitor)
            self._parents[path] = visitor.parents
        return self._parents[path].get(id(node))

    def position(self, path: Path, node: cst.CSTNode) -> CodeRange | None:
        if path not in self._positions:
            wrapper = MetadataWrapper(self.module(path), unsafe_skip_copy=True)
            self._positions[path] = wrapper.resolve(PositionProvider)
        return self._positions[path].get(node)

    def statement_of(self, path: Path, node: cst.CSTNode) -> cst.CSTNode | None:
        """The statement (simple line or compound statement) that holds ``node``."""
        current: cst.CSTNode | None = node
        while current is not None and not isinstance(current, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            current = self.parent(path, current)
        return current

    # -- definitions -----------------------------------------------------------------------------------------
    def function(self, path: Path, qualname: str) -> cst.FunctionDef | None:
        """The ``def`` a recorded function name points at in ``path``."""
        parts = qualname.split(".")
        name, owner = parts[-1], parts[-2] if len(parts) > 1 else ""
        body = self.module(path).body
        for stmt in body:
            if isinstance(stmt, cst.ClassDef) and stmt.name.value == owner:
                for inner in stmt.body.body:
                    if isinstance(inner, cst.FunctionDef) and inner.name.value == name:
                        return inner
        return next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)

    def constants(self, path: Path) -> dict[str, cst.BaseExpression]:
        """Module-level ``NAME = <expr>`` bindings (a name bound twice is left out)."""
        if path not in self._constants:
            self._constants[path] = self._find_constants(path)
        return self._constants[path]

    def _find_constants(self, path: Path) -> dict[str, cst.BaseExpression]:
        out: dict[str, cst.BaseExpression] = {}
        twice: set[str] = set()
        for stmt in self.module(path).body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                target: cst.BaseExpression | None = None
                value: cst.BaseExpression | None = None
                if isinstance(small, cst.Assign) and len(small.targets) == 1:
                    target, value = small.targets[0].target, small.value
                elif isinstance(small, cst.AnnAssign) and small.value is not None:
                    target, value = small.target, small.value
                if isinstance(target, cst.Name) and value is not None:
                    if target.value in out:
                        twice.add(target.value)
                    out[target.value] = value
        return {k: v for k, v in out.items() if k not in twice}

    def imports(self, path: Path) -> dict[str, tuple[Path, str]]:
        """``from m import X as Y`` at module level → {Y: (file of m, X)} for modules found under the root."""
        if path not in self._imports:
            self._imports[path] = self._find_imports(path)
        return self._imports[path]

    def _find_imports(self, path: Path) -> dict[str, tuple[Path, str]]:
        out: dict[str, tuple[Path, str]] = {}
        for stmt in self.module(path).body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if not isinstance(small, cst.ImportFrom) or isinstance(small.names, cst.ImportStar):
                    continue
                target = self.resolve_module(path, dotted(small.module), len(small.relative))
                if target is None:
                    continue
                for alias in small.names:
                    if isinstance(alias.name, cst.Name):
                        local = alias.asname.name if alias.asname is not None else alias.name
                        if isinstance(local, cst.Name):
                            out[local.value] = (target, alias.name.value)
        return out

    def resolve_module(self, path: Path, module: str, level: int) -> Path | None:
        """The file of ``module`` imported from ``path`` (relative when ``level`` > 0), searched up to the root."""
        parts = [p for p in module.split(".") if p]
        if level > 0:
            bases = [path.parents[level - 1]] if level <= len(path.parents) else []
        else:
            bases = [d for d in path.parents if d == self.root or self.root in d.parents]
        for base in bases:
            candidate = base.joinpath(*parts)
            for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                if parts and file.is_file():
                    return file
        return None

    def local_def(self, path: Path, name: str) -> tuple[Path, cst.FunctionDef] | None:
        """A module-level ``def`` called by ``name`` from ``path``: defined there or imported from a local module."""
        for stmt in self.module(path).body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                return path, stmt
        imported = self.imports(path).get(name)
        if imported is not None:
            try:
                found = self.function(imported[0], imported[1])
            except SourceError:
                return None
            if found is not None:
                return imported[0], found
        return None

    # -- string constants ------------------------------------------------------------------------------------
    def string_constant(self, path: Path, name: str) -> tuple[Constant, str] | None:
        """A plain string constant, in ``path`` or imported into it."""
        value = self.constants(path).get(name)
        if value is None:
            imported = self.imports(path).get(name)
            if imported is None:
                return None
            path, name = imported
            try:
                value = self.constants(path).get(name)
            except SourceError:
                return None
        text = None if value is None else string_value(value)
        if text is None or not isinstance(value, cst.SimpleString):
            return None
        return Constant(path, name, value), text

    def constant_uses(self, constant: Constant, files: Sequence[Path]) -> list[tuple[Path, cst.Name]] | None:
        """Every reference to ``constant`` in its package and ``files``; None when one cannot be told apart."""
        uses: list[tuple[Path, cst.Name]] = []
        for path in sorted({constant.path, *constant.path.parent.glob("*.py"), *files}):
            try:
                module = self.module(path)
            except SourceError:
                return None  # a file we cannot read may use it
            if path == constant.path:
                aliases = {constant.name}
            else:
                aliases = {k for k, (p, n) in self.imports(path).items() if p == constant.path and n == constant.name}
            for node in walk(module):
                if isinstance(node, cst.Attribute) and node.attr.value == constant.name:
                    return None  # module.NAME: a use we do not follow
                if isinstance(node, cst.Name) and node.value in aliases:
                    parent = self.parent(path, node)
                    if isinstance(parent, _NOT_A_USE) or (isinstance(parent, cst.Arg) and parent.keyword is node):
                        continue
                    uses.append((path, node))
        return uses


def dotted(node: cst.Attribute | cst.Name | None) -> str:
    """The dotted name an attribute chain spells (``a.b.c``; "" for none)."""
    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    inner = node.value
    assert isinstance(inner, cst.Attribute | cst.Name)
    return f"{dotted(inner)}.{node.attr.value}"
