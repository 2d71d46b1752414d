"""Find the code behind a recorded statement with libcst: its function, its ``execute`` calls, the pieces of its SQL.

A recorded function name (``shop.handlers.capture_payment``) names a ``def`` in the recorded file (a method when
the second-to-last part names a class there). The statement is looked for in that function's ``*.execute(sql,
params)`` calls, then in the module-level helpers it calls (``_record_charge``), breadth first. A call's SQL
argument is evaluated symbolically into *pieces*: inline string literals, module-level string constants (also
imported ones) and opaque values (local variables); a conditional expression yields one variant per branch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Final

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

_EXECUTE: Final = frozenset({"execute", "executemany"})
_MAX_VARIANTS: Final = 32
_HELPER_DEPTH: Final = 3
_NOT_A_USE: Final = (cst.Param, cst.FunctionDef, cst.ClassDef, cst.ImportAlias, cst.AsName, cst.AssignTarget)


class SourceError(Exception):
    """A source file that cannot be read or parsed."""


@dataclass(frozen=True, slots=True, eq=False)
class Constant:
    """A module-level ``NAME = "..."`` string constant."""

    path: Path
    name: str
    node: cst.SimpleString


@dataclass(frozen=True, slots=True, eq=False)
class Piece:
    """One piece of a call's SQL: its text in this variant and the expression that gives it at the call site."""

    text: str
    start: int
    node: cst.BaseExpression
    kind: str  # literal | constant | opaque
    constant: Constant | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.text)


@dataclass(frozen=True, slots=True, eq=False)
class CallSite:
    """One ``execute`` call that runs the recorded statement."""

    path: Path  # the file that holds the call
    entry_path: Path
    entry: cst.FunctionDef  # the recorded function
    func: cst.FunctionDef  # the def that holds the call (the entry, or a helper it calls)
    chain: tuple[cst.Call, ...]  # the calls in ``entry`` (and helpers) that lead to ``func``
    call: cst.Call
    pieces: tuple[Piece, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)

    @property
    def receiver(self) -> cst.BaseExpression:
        func = self.call.func
        assert isinstance(func, cst.Attribute)
        return func.value

    @property
    def params(self) -> cst.BaseExpression | None:
        args = [a for a in self.call.args if a.keyword is None]
        named = [a for a in self.call.args if a.keyword is not None and a.keyword.value == "params"]
        return args[1].value if len(args) > 1 else named[0].value if named else None


def normalise(sql: str) -> str:
    """Whitespace-insensitive form of a statement, for matching recorded text against code."""
    return " ".join(sql.split()).rstrip(";").rstrip()


def map_offset(recorded: str, code: str, at: int) -> int:
    """The offset in ``code`` that corresponds to offset ``at`` in ``recorded`` (they differ only in whitespace)."""
    solid = sum(1 for c in recorded[:at] if not c.isspace())
    i = seen = 0
    while seen < solid and i < len(code):
        seen += not code[i].isspace()
        i += 1
    if at > 0 and recorded[at - 1].isspace():
        while i < len(code) and code[i].isspace():
            i += 1
    return i


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


_Part = tuple[str, cst.BaseExpression, str, Constant | None]


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
                target = self.resolve_module(path, _dotted(small.module), len(small.relative))
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

    # -- statements ------------------------------------------------------------------------------------------
    def call_sites(self, path: Path, qualname: str, statement: str) -> list[CallSite]:
        """Every ``execute`` call that runs ``statement``: in the function, else in the nearest helpers it calls."""
        entry = self.function(path, qualname)
        if entry is None:
            return []
        want = normalise(statement)
        level: list[tuple[Path, cst.FunctionDef, tuple[cst.Call, ...]]] = [(path, entry, ())]
        seen = {id(entry)}
        for _ in range(_HELPER_DEPTH + 1):
            found: list[CallSite] = []
            following: list[tuple[Path, cst.FunctionDef, tuple[cst.Call, ...]]] = []
            for file, func, chain in level:
                for call in _calls(func):
                    site = self._match(file, (path, entry), func, chain, call, want)
                    if site is not None:
                        found.append(site)
                    elif isinstance(call.func, cst.Name):
                        helper = self.local_def(file, call.func.value)
                        if helper is not None and id(helper[1]) not in seen:
                            seen.add(id(helper[1]))
                            following.append((helper[0], helper[1], (*chain, call)))
            if found:
                return found
            level = following
        return []

    def _match(
        self,
        path: Path,
        entry: tuple[Path, cst.FunctionDef],
        func: cst.FunctionDef,
        chain: tuple[cst.Call, ...],
        call: cst.Call,
        want: str,
    ) -> CallSite | None:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in _EXECUTE and call.args):
            return None
        if call.args[0].keyword is not None:
            return None
        for variant in self._variants(path, func, call.args[0].value, 0) or []:
            if normalise("".join(p[0] for p in variant)) == want:
                pieces, at = [], 0
                for text, node, kind, constant in variant:
                    pieces.append(Piece(text, at, node, kind, constant))
                    at += len(text)
                return CallSite(path, entry[0], entry[1], func, chain, call, tuple(pieces))
        return None

    def _variants(
        self, path: Path, func: cst.FunctionDef | None, node: cst.BaseExpression, depth: int
    ) -> list[list[_Part]] | None:
        """Each value ``node`` can have, as pieces; None when one is not a known string."""
        if depth > 8:
            return None
        literal = string_value(node)
        if literal is not None:
            return [[(literal, node, "literal", None)]]
        if isinstance(node, cst.ConcatenatedString):
            return self._concat(path, func, [node.left, node.right], depth)
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            return self._concat(path, func, [node.left, node.right], depth)
        if isinstance(node, cst.IfExp):
            body = self._variants(path, func, node.body, depth + 1)
            orelse = self._variants(path, func, node.orelse, depth + 1)
            return None if body is None or orelse is None else (body + orelse)[:_MAX_VARIANTS]
        if isinstance(node, cst.Name):
            return self._name(path, func, node, depth)
        return None

    def _concat(
        self, path: Path, func: cst.FunctionDef | None, nodes: Sequence[cst.BaseExpression], depth: int
    ) -> list[list[_Part]] | None:
        options = [self._variants(path, func, n, depth + 1) for n in nodes]
        if any(o is None for o in options):
            return None
        combos = product(*[o for o in options if o is not None])
        limited = (combo for _, combo in zip(range(_MAX_VARIANTS), combos, strict=False))
        return [[part for parts in combo for part in parts] for combo in limited]

    def _name(self, path: Path, func: cst.FunctionDef | None, node: cst.Name, depth: int) -> list[list[_Part]] | None:
        if func is not None:
            values = _local_values(func, node.value)
            if values is None:
                return None
            if values:  # a local variable: opaque pieces, one per value it can have
                out: list[list[_Part]] = []
                for value in values:
                    for variant in self._variants(path, func, value, depth + 1) or []:
                        out.append([("".join(p[0] for p in variant), node, "opaque", None)])
                return out[:_MAX_VARIANTS] or None
        constant = self._constant(path, node.value)
        if constant is not None:
            return [[(constant[1], node, "constant", constant[0])]]
        composite = self.constants(path).get(node.value)
        if composite is not None:  # a constant made of several pieces
            variants = self._variants(path, None, composite, depth + 1)
            return [[("".join(p[0] for p in v), node, "opaque", None)] for v in variants] if variants else None
        return None

    def _constant(self, path: Path, name: str) -> tuple[Constant, str] | None:
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


def _dotted(node: cst.Attribute | cst.Name | None) -> str:
    if node is None:
        return ""
    if isinstance(node, cst.Name):
        return node.value
    inner = node.value
    assert isinstance(inner, cst.Attribute | cst.Name)
    return f"{_dotted(inner)}.{node.attr.value}"


def _calls(func: cst.FunctionDef) -> list[cst.Call]:
    return [n for n in walk(func.body) if isinstance(n, cst.Call)]


def _local_values(func: cst.FunctionDef, name: str) -> list[cst.BaseExpression] | None:
    """Values assigned to local ``name`` in ``func``; None when it is also bound some other way (+=, for, with)."""
    values: list[cst.BaseExpression] = []
    for node in walk(func.body):
        if isinstance(node, cst.Assign):
            for target in node.targets:
                if isinstance(target.target, cst.Name) and target.target.value == name:
                    values.append(node.value)
                elif any(isinstance(n, cst.Name) and n.value == name for n in walk(target.target)):
                    return None
        elif isinstance(node, cst.AugAssign | cst.For | cst.AsName | cst.NamedExpr) and any(
            isinstance(n, cst.Name) and n.value == name for n in walk(_bound(node))
        ):
            return None
    if any(p.name.value == name for p in [*func.params.params, *func.params.kwonly_params]) and not values:
        return None  # a parameter: unknown text
    return values


def _bound(node: cst.AugAssign | cst.For | cst.AsName | cst.NamedExpr) -> cst.CSTNode:
    if isinstance(node, cst.AugAssign | cst.For | cst.NamedExpr):
        return node.target
    return node.name


def bound_names(func: cst.FunctionDef, before: CodeRange | None, index: SourceIndex, path: Path) -> set[str]:
    """Names bound in ``func`` (parameters, assignment and unpacking targets) before ``before``'s line."""
    names = {p.name.value for p in [*func.params.params, *func.params.kwonly_params, *func.params.posonly_params]}
    for node in walk(func.body):
        targets: list[cst.CSTNode] = []
        if isinstance(node, cst.Assign):
            targets = [t.target for t in node.targets]
        elif isinstance(node, cst.AnnAssign | cst.AugAssign | cst.For):
            targets = [node.target]
        elif isinstance(node, cst.AsName):
            targets = [node.name]
        if not targets:
            continue
        at = index.position(path, node)
        if before is not None and at is not None and at.start.line >= before.start.line:
            continue
        for target in targets:
            names |= {n.value for n in walk(target) if isinstance(n, cst.Name)}
    return names
