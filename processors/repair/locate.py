"""Find the code behind a recorded statement: its function's ``execute`` calls, and the pieces of their SQL.

The statement is looked for in the recorded function's ``*.execute(sql, params)`` calls, then in the module-level
helpers it calls (``_record_charge``), breadth first. A call's SQL argument is evaluated symbolically into
*pieces*: inline string literals, module-level string constants (also imported ones) and opaque values (local
variables); a conditional expression yields one variant per branch. Recorded and code text are compared with
whitespace normalised (:func:`normalise`); :func:`map_offset` carries an offset from one to the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Final

import libcst as cst
from libcst.metadata import CodeRange

from processors.repair.source import Constant, SourceIndex, string_value, walk

_EXECUTE: Final = frozenset({"execute", "executemany"})
_MAX_VARIANTS: Final = 32
_HELPER_DEPTH: Final = 3


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


_Part = tuple[str, cst.BaseExpression, str, Constant | None]


def call_sites(index: SourceIndex, path: Path, qualname: str, statement: str) -> list[CallSite]:
    """Every ``execute`` call that runs ``statement``: in the function, else in the nearest helpers it calls.

    Raises :class:`~processors.repair.source.SourceError` when the recorded file cannot be read or parsed.
    """
    entry = index.function(path, qualname)
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
                site = _match(index, file, (path, entry), func, chain, call, want)
                if site is not None:
                    found.append(site)
                elif isinstance(call.func, cst.Name):
                    helper = index.local_def(file, call.func.value)
                    if helper is not None and id(helper[1]) not in seen:
                        seen.add(id(helper[1]))
                        following.append((helper[0], helper[1], (*chain, call)))
        if found:
            return found
        level = following
    return []


def _match(
    index: SourceIndex,
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
    for variant in _variants(index, path, func, call.args[0].value, 0) or []:
        if normalise("".join(p[0] for p in variant)) == want:
            pieces, at = [], 0
            for text, node, kind, constant in variant:
                pieces.append(Piece(text, at, node, kind, constant))
                at += len(text)
            return CallSite(path, entry[0], entry[1], func, chain, call, tuple(pieces))
    return None


def _variants(
    index: SourceIndex, path: Path, func: cst.FunctionDef | None, node: cst.BaseExpression, depth: int
) -> list[list[_Part]] | None:
    """Each value ``node`` can have, as pieces; None when one is not a known string."""
    if depth > 8:
        return None
    literal = string_value(node)
    if literal is not None:
        return [[(literal, node, "literal", None)]]
    if isinstance(node, cst.ConcatenatedString):
        return _concat(index, path, func, [node.left, node.right], depth)
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        return _concat(index, path, func, [node.left, node.right], depth)
    if isinstance(node, cst.IfExp):
        body = _variants(index, path, func, node.body, depth + 1)
        orelse = _variants(index, path, func, node.orelse, depth + 1)
        return None if body is None or orelse is None else (body + orelse)[:_MAX_VARIANTS]
    if isinstance(node, cst.Name):
        return _name(index, path, func, node, depth)
    return None


def _concat(
    index: SourceIndex, path: Path, func: cst.FunctionDef | None, nodes: Sequence[cst.BaseExpression], depth: int
) -> list[list[_Part]] | None:
    options = [_variants(index, path, func, n, depth + 1) for n in nodes]
    if any(o is None for o in options):
        return None
    combos = product(*[o for o in options if o is not None])
    limited = (combo for _, combo in zip(range(_MAX_VARIANTS), combos, strict=False))
    return [[part for parts in combo for part in parts] for combo in limited]


def _name(
    index: SourceIndex, path: Path, func: cst.FunctionDef | None, node: cst.Name, depth: int
) -> list[list[_Part]] | None:
    if func is not None:
        values = _local_values(func, node.value)
        if values is None:
            return None
        if values:  # a local variable: opaque pieces, one per value it can have
            out: list[list[_Part]] = []
            for value in values:
                for variant in _variants(index, path, func, value, depth + 1) or []:
                    out.append([("".join(p[0] for p in variant), node, "opaque", None)])
            return out[:_MAX_VARIANTS] or None
    constant = index.string_constant(path, node.value)
    if constant is not None:
        return [[(constant[1], node, "constant", constant[0])]]
    composite = index.constants(path).get(node.value)
    if composite is not None:  # a constant made of several pieces
        variants = _variants(index, path, None, composite, depth + 1)
        return [[("".join(p[0] for p in v), node, "opaque", None)] for v in variants] if variants else None
    return None


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
