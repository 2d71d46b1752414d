"""Code edits keyed by libcst node identity, rendered into new file contents; unified diff, apply and revert.

Edits are requested against the original trees of a :class:`SourceIndex` and applied by one transformer pass per
file, so everything the edits do not touch keeps its bytes. New string literals are libcst nodes built from
``repr`` and checked to evaluate back to the intended text; SQL text never becomes code any other way.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Final

import libcst as cst
from sqlglot import TokenType
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from processors.repair.locate import CallSite, Constant, Piece, SourceIndex, map_offset

_SPLIT_BEFORE: Final = frozenset(
    {TokenType.WHERE, TokenType.RETURNING, TokenType.VALUES, TokenType.ON, TokenType.FOR, TokenType.SET,
     TokenType.FROM, TokenType.AND, TokenType.OR, TokenType.ORDER_BY, TokenType.LIMIT}
)  # fmt: skip
_RETRY: Final = """\
for attempt in range(3):
    try:
        pass
        break
    except psycopg.errors.SerializationFailure:
        if attempt == 2:
            raise
"""
_LOOP_NAMES: Final = ("attempt", "_attempt", "retry_attempt")

Edit = Callable[[cst.CSTNode], cst.CSTNode]
_ConstantUse = tuple[Path, Piece, frozenset[tuple[int, str]]]  # where, the piece at the call site, insertions


class PatchError(RuntimeError):
    """A patch that cannot be built, applied or reverted safely."""


@dataclass(frozen=True, slots=True)
class FilePatch:
    """One file's bytes before and after the repair (path relative to the root, POSIX separators)."""

    path: str
    before: bytes
    after: bytes


def string_literal(text: str) -> cst.SimpleString:
    """A string literal whose value is exactly ``text`` (double-quoted when that needs no escaping)."""
    code = repr(text)
    if code.startswith("'") and '"' not in text and "'" not in text:
        code = '"' + code[1:-1] + '"'
    node = cst.SimpleString(code)
    if node.evaluated_value != text:
        raise PatchError("a string literal does not round-trip")
    return node


def _edited_in_place(node: cst.SimpleString, insertions: Sequence[tuple[int, str]]) -> cst.SimpleString | None:
    """The literal with the text inserted into its own source (quotes, prefix, line breaks kept), when that is safe:
    the literal has no escapes, the inserted text has no quote, backslash or line break, and it round-trips."""
    body, value = node.raw_value, node.evaluated_value
    if body != value or any(c in text for _, text in insertions for c in "\\\"'\r\n"):
        return None
    candidate = cst.SimpleString(node.prefix + node.quote + _insert(body, insertions) + node.quote)
    try:
        same = candidate.evaluated_value == _insert(body, insertions)
    except (SyntaxError, ValueError):
        return None
    return candidate if same else None


def comment_lines(text: str, indent: int, line_length: int) -> list[cst.EmptyLine]:
    """``# text`` wrapped to the line length, as libcst leading lines (no line breaks can get in)."""
    flat = " ".join(text.split())
    width = max(40, line_length - indent - 2)
    return [
        cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=cst.Comment("# " + line))
        for line in textwrap.wrap(flat, width)
    ]


def _insert(text: str, insertions: Sequence[tuple[int, str]]) -> str:
    for at, piece in sorted(insertions, key=lambda i: i[0], reverse=True):
        text = text[:at] + piece + text[at:]
    return text


def _split_sql(text: str, width: int, tail: int) -> list[str]:
    """``text`` cut before clause keywords into chunks of at most ``width``, the last one leaving room for ``tail``."""
    try:
        tokens = Dialect.get_or_raise("postgres").tokenize(text)
    except SqlglotError:
        return [text]
    cuts = [t.start - 1 for t in tokens if t.token_type in _SPLIT_BEFORE and t.start > 0 and text[t.start - 1] == " "]
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if b > a]
    lines: list[list[str]] = []
    for piece in pieces:
        if lines and sum(map(len, lines[-1])) + len(piece) <= width:
            lines[-1].append(piece)
        else:
            lines.append([piece])
    last: list[str] = []
    while len(lines[-1]) > 1 and sum(map(len, lines[-1])) + tail > width:
        last.insert(0, lines[-1].pop())
    return ["".join(line) for line in ([*lines, last] if last else lines)]


def _choose(pieces: Sequence[Piece], at: int) -> tuple[Piece, int, str] | None:
    """Where text inserted at ``at`` of the SQL goes: into a literal, a constant, or a new piece next to one."""
    inside = next((p for p in pieces if p.start < at < p.end), None)
    if inside is not None:
        return None if inside.kind == "opaque" else (inside, at - inside.start, inside.kind)
    ending = [p for p in pieces if p.end == at and p.text]
    starting = [p for p in pieces if p.start == at and p.text]
    for kind in ("literal", "constant"):
        for p in ending:
            if p.kind == kind:
                return p, len(p.text), kind
        for p in starting:
            if p.kind == kind:
                return p, 0, kind
    if ending:
        return ending[0], 0, "append"
    if starting:
        return starting[0], 0, "prepend"
    return None


class _Rewriter(cst.CSTTransformer):
    def __init__(self, edits: dict[int, list[Edit]], after: dict[int, list[cst.BaseStatement]]) -> None:
        super().__init__()
        self.edits = edits
        self.after = after

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.FlattenSentinel[cst.CSTNode]:
        node = updated_node
        for edit in self.edits.get(id(original_node), ()):
            node = edit(node)
        extra = self.after.get(id(original_node))
        return cst.FlattenSentinel([node, *extra]) if extra else node


class Patch:
    """The code edits of one plan; ``render`` turns them into new file contents."""

    def __init__(self, index: SourceIndex, *, line_length: int = 120) -> None:
        self.index = index
        self.line_length = line_length
        self._literals: dict[int, tuple[Path, cst.SimpleString, set[tuple[int, str]]]] = {}
        self._beside: dict[int, tuple[Path, cst.BaseExpression, list[str], list[str]]] = {}  # before, after
        self._wholes: dict[int, tuple[Path, cst.BaseExpression, str]] = {}
        self._constants: dict[tuple[Path, str], tuple[Constant, dict[int, _ConstantUse]]] = {}
        self._params: dict[int, tuple[Path, cst.Tuple | cst.List, dict[int, cst.BaseExpression]]] = {}
        self._comments: dict[int, tuple[Path, cst.CSTNode, list[str]]] = {}
        self._after: dict[int, tuple[Path, dict[str, cst.BaseStatement]]] = {}
        self._retries: dict[int, tuple[Path, cst.With, cst.BaseStatement, str, str]] = {}
        self._imports: dict[Path, set[str]] = {}
        self._edits: dict[int, tuple[Path, dict[str, Edit]]] = {}

    # -- requests --------------------------------------------------------------------------------------------
    def sql(self, site: CallSite, recorded: str, insertions: Sequence[tuple[int, str]]) -> None:
        """Insert SQL text into the statement ``site`` runs (offsets into the recorded statement)."""
        code = site.text
        moved = [(map_offset(recorded, code, at), text) for at, text in insertions]
        choices = [_choose(site.pieces, at) for at, _ in moved]
        if any(c is None for c in choices):  # inside an opaque value: replace the whole SQL argument
            node = site.call.args[0].value
            self._wholes[id(node)] = (site.path, node, _insert(code, moved))
            return
        per_constant: dict[int, tuple[Piece, set[tuple[int, str]]]] = {}
        for choice, (_, text) in zip(choices, moved, strict=True):
            assert choice is not None
            piece, offset, kind = choice
            if kind == "literal":
                assert isinstance(piece.node, cst.SimpleString)
                entry = self._literals.setdefault(id(piece.node), (site.path, piece.node, set()))
                entry[2].add((offset, text))
            elif kind == "constant":
                per_constant.setdefault(id(piece.node), (piece, set()))[1].add((offset, text))
            else:
                beside = self._beside.setdefault(id(piece.node), (site.path, piece.node, [], []))
                texts = beside[3] if kind == "append" else beside[2]
                if text not in texts:  # another writer through the same call
                    texts.append(text)
        for piece, inserted in per_constant.values():
            assert piece.constant is not None
            key = (piece.constant.path, piece.constant.name)
            uses = self._constants.setdefault(key, (piece.constant, {}))[1]
            uses[id(piece.node)] = (site.path, piece, frozenset(inserted))

    def params(self, site: CallSite, new: Sequence[tuple[int, cst.BaseExpression]]) -> None:
        """Insert values into the call's parameter tuple (indices are positions in the new tuple)."""
        if not new:
            return
        params = site.params
        if not isinstance(params, cst.Tuple | cst.List):
            raise PatchError("the statement's parameters are not a tuple or list literal")
        entry = self._params.setdefault(id(params), (site.path, params, {}))
        for index, value in new:
            entry[2].setdefault(index, value)

    def edit(self, path: Path, node: cst.CSTNode, key: str, edit: Edit) -> None:
        """Replace ``node`` by ``edit(node)`` (once per ``key``)."""
        self._edits.setdefault(id(node), (path, {}))[1].setdefault(key, edit)

    def comment(self, path: Path, statement: cst.CSTNode, text: str) -> None:
        entry = self._comments.setdefault(id(statement), (path, statement, []))
        if text not in entry[2]:
            entry[2].append(text)

    def after(self, path: Path, statement: cst.CSTNode, key: str, new: cst.BaseStatement) -> None:
        """Insert ``new`` right after ``statement`` (once per ``key``)."""
        self._after.setdefault(id(statement), (path, {}))[1].setdefault(key, new)

    def retry(self, path: Path, block: cst.With, setup: cst.BaseStatement, comment: str) -> None:
        """Run the ``with ...transaction()`` block in a retry loop on serialization failures, ``setup`` first."""
        func = self._enclosing_def(path, block)
        taken = {n.value for n in _names(func)} if func is not None else set()
        var = next((n for n in _LOOP_NAMES if n not in taken), None)
        if var is None:
            raise PatchError("no free name for the retry loop variable")
        self._retries.setdefault(id(block), (path, block, setup, var, comment))
        self._imports.setdefault(path, set()).add("psycopg")

    # -- rendering -------------------------------------------------------------------------------------------
    def render(self) -> list[tuple[Path, bytes, bytes]]:
        """(path, before, after) for every file the edits change."""
        edits: dict[Path, dict[int, list[Edit]]] = {}
        after: dict[Path, dict[int, list[cst.BaseStatement]]] = {}

        def add(path: Path, node: cst.CSTNode, edit: Edit) -> None:
            edits.setdefault(path, {}).setdefault(id(node), []).append(edit)

        self._resolve_constants()
        for path, literal, inserted in self._literals.values():
            value = literal.evaluated_value
            assert isinstance(value, str)
            ordered = sorted(inserted)
            edited = _edited_in_place(literal, ordered)
            add(path, literal, _becomes(self._fit(path, literal, _insert(value, ordered), edited)))
        for path, node, ahead, behind in self._beside.values():
            add(path, node, partial(_beside, before="".join(ahead), after="".join(behind)))
        for path, node, text in self._wholes.values():
            add(path, node, _becomes(string_literal(text)))
        for path, params, values in self._params.values():
            add(path, params, partial(_with_params, values=values))
        for path, statement, texts in self._comments.values():
            lines = [line for t in texts for line in comment_lines(t, self._column(path, statement), self.line_length)]
            add(path, statement, partial(_with_leading, lines=lines))
        for path, block, setup, var, text in self._retries.values():
            lines = comment_lines(text, self._column(path, block), self.line_length)
            add(path, block, partial(_retry_loop, setup=setup, var=var, lines=lines))
        for node_id, (path, generic) in self._edits.items():
            edits.setdefault(path, {}).setdefault(node_id, []).extend(generic.values())
        for node_id, (path, new) in self._after.items():
            after.setdefault(path, {})[node_id] = list(new.values())
        out: list[tuple[Path, bytes, bytes]] = []
        for path in sorted(set(edits) | set(after) | set(self._imports)):
            module = self.index.module(path)
            updated = module.visit(_Rewriter(edits.get(path, {}), after.get(path, {})))
            assert isinstance(updated, cst.Module)
            updated = _with_imports(updated, self._imports.get(path, set()))
            try:
                compile(updated.code, str(path), "exec")
            except SyntaxError as exc:  # a bug here, never a broken patch for the developer
                raise PatchError(f"the repaired {path} does not compile: {exc}") from exc
            original = self.index.data(path)
            if updated.bytes != original:
                out.append((path, original, updated.bytes))
        return out

    def _resolve_constants(self) -> None:
        """Edit a constant when every use of it gets the same edit; else edit at each call site."""
        for constant, uses in self._constants.values():
            inserted = {v[2] for v in uses.values()}
            known = self.index.constant_uses(constant, sorted({v[0] for v in uses.values()}))
            if known is not None and len(inserted) == 1 and {id(n) for _, n in known} <= set(uses):
                entry = self._literals.setdefault(id(constant.node), (constant.path, constant.node, set()))
                entry[2].update(next(iter(inserted)))
                continue
            for path, piece, texts in uses.values():
                offsets = {at for at, _ in texts}
                ordered = [t for _, t in sorted(texts, key=lambda i: i[0])]
                if offsets in ({len(piece.text)}, {0}):
                    beside = self._beside.setdefault(id(piece.node), (path, piece.node, [], []))
                    side = beside[3] if offsets == {len(piece.text)} else beside[2]
                    side.extend(t for t in ordered if t not in side)
                else:
                    self._wholes[id(piece.node)] = (path, piece.node, _insert(piece.text, sorted(texts)))

    def _fit(
        self, path: Path, original: cst.SimpleString, text: str, edited: cst.SimpleString | None = None
    ) -> cst.BaseExpression:
        """The new literal (``edited`` when given); split before clause keywords, aligned, when too long."""
        literal = edited or string_literal(text)
        where = self.index.position(path, original)
        if not isinstance(self.index.parent(path, original), cst.Arg) or where is None:
            return literal
        if where.start.line != where.end.line:
            return literal
        line = self.index.data(path).decode().splitlines()[where.start.line - 1]
        column, tail = where.start.column, len(line) - where.end.column
        if column + len(literal.value) + tail <= self.line_length:
            return literal
        chunks = _split_sql(text, self.line_length - column - 2, tail)
        if len(chunks) < 2:
            return literal
        result: cst.SimpleString | cst.ConcatenatedString = string_literal(chunks[-1])
        gap = cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(), indent=False, last_line=cst.SimpleWhitespace(" " * column)
        )
        for chunk in reversed(chunks[:-1]):
            result = cst.ConcatenatedString(left=string_literal(chunk), right=result, whitespace_between=gap)
        return result

    def _column(self, path: Path, node: cst.CSTNode) -> int:
        where = self.index.position(path, node)
        return where.start.column if where is not None else 0

    def _enclosing_def(self, path: Path, node: cst.CSTNode) -> cst.FunctionDef | None:
        current = self.index.parent(path, node)
        while current is not None and not isinstance(current, cst.FunctionDef):
            current = self.index.parent(path, current)
        return current


def _names(node: cst.CSTNode) -> list[cst.Name]:
    out: list[cst.Name] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            out.append(n)
        stack.extend(n.children)
    return out


def _becomes(replacement: cst.CSTNode) -> Edit:
    def edit(_: cst.CSTNode) -> cst.CSTNode:
        return replacement

    return edit


def _beside(node: cst.CSTNode, *, before: str, after: str) -> cst.CSTNode:
    assert isinstance(node, cst.BaseExpression)
    result: cst.BaseExpression = node
    if after:
        result = cst.BinaryOperation(left=result, operator=cst.Add(), right=string_literal(after))
    if before:
        result = cst.BinaryOperation(left=string_literal(before), operator=cst.Add(), right=result)
    return result


def _with_params(node: cst.CSTNode, *, values: dict[int, cst.BaseExpression]) -> cst.CSTNode:
    assert isinstance(node, cst.Tuple | cst.List)
    elements: list[cst.BaseElement] = list(node.elements)
    for index, value in sorted(values.items()):
        elements.insert(min(index, len(elements)), cst.Element(value=value.deep_clone()))
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    fixed = [e if _spaced(e.comma) else e.with_changes(comma=comma) for e in elements[:-1]]
    last = elements[-1]
    if len(node.elements) == 1 and isinstance(node, cst.Tuple):  # (x,) → (x, y): no trailing comma
        last = last.with_changes(comma=cst.MaybeSentinel.DEFAULT)
    fixed.append(last)
    return node.with_changes(elements=fixed)


def _spaced(comma: cst.Comma | cst.MaybeSentinel) -> bool:
    """A comma already followed by a space or a line break (``(x,)``'s is not)."""
    after = comma.whitespace_after if isinstance(comma, cst.Comma) else None
    return not (after is None or (isinstance(after, cst.SimpleWhitespace) and not after.value))


def _with_leading(node: cst.CSTNode, *, lines: list[cst.EmptyLine]) -> cst.CSTNode:
    if isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        return node.with_changes(leading_lines=[*node.leading_lines, *lines])
    return node


def _retry_loop(node: cst.CSTNode, *, setup: cst.BaseStatement, var: str, lines: list[cst.EmptyLine]) -> cst.CSTNode:
    """``with ...:`` → ``for var in range(3): try: with ...: <setup> ...; break; except SerializationFailure``."""
    assert isinstance(node, cst.With) and isinstance(node.body, cst.IndentedBlock)
    inner = node.with_changes(leading_lines=(), body=node.body.with_changes(body=[setup, *node.body.body]))
    loop = cst.parse_statement(_RETRY.replace("attempt", var))  # var is one of _LOOP_NAMES
    assert isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)
    attempt = loop.body.body[0]
    assert isinstance(attempt, cst.Try) and isinstance(attempt.body, cst.IndentedBlock)
    attempt = attempt.with_changes(body=attempt.body.with_changes(body=[inner, attempt.body.body[1]]))
    return loop.with_changes(body=loop.body.with_changes(body=[attempt]), leading_lines=[*node.leading_lines, *lines])


def _with_imports(module: cst.Module, names: set[str]) -> cst.Module:
    """``import name`` after the last top-level import, for each name not imported yet."""
    present = {
        alias.evaluated_name
        for stmt in module.body
        if isinstance(stmt, cst.SimpleStatementLine)
        for small in stmt.body
        if isinstance(small, cst.Import)
        for alias in small.names
        if alias.asname is None
    }
    missing = sorted(names - present)
    if not missing:
        return module
    last = max(
        (
            i
            for i, stmt in enumerate(module.body)
            if isinstance(stmt, cst.SimpleStatementLine)
            and any(isinstance(s, cst.Import | cst.ImportFrom) for s in stmt.body)
        ),
        default=-1,
    )
    new = [cst.parse_statement(f"import {name}") for name in missing]  # names are fixed module names, not input
    body = list(module.body)
    return module.with_changes(body=[*body[: last + 1], *new, *body[last + 1 :]])


# -- diff, apply, revert -----------------------------------------------------------------------------------------
def unified_diff(files: Sequence[FilePatch]) -> str:
    """A ``git apply``-able unified diff of the files (``a/`` and ``b/`` prefixes, paths relative to the root)."""
    out: list[str] = []
    for f in sorted(files, key=lambda f: f.path):
        before = f.before.decode().splitlines(keepends=True)
        after = f.after.decode().splitlines(keepends=True)
        for line in difflib.unified_diff(before, after, f"a/{f.path}", f"b/{f.path}"):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _swap(files: Sequence[FilePatch], root: Path, *, forward: bool) -> None:
    todo: list[tuple[Path, bytes]] = []
    for f in files:
        path = root / f.path
        current = path.read_bytes()
        source, target = (f.before, f.after) if forward else (f.after, f.before)
        if current == target:
            continue
        if current != source:
            raise PatchError(f"{f.path} changed since the plan was made; not touching it")
        todo.append((path, target))
    for path, data in todo:
        path.write_bytes(data)


def apply_files(files: Sequence[FilePatch], root: Path) -> None:
    """Write the repaired files (all checked first: each must hold its planned or its repaired bytes)."""
    _swap(files, root, forward=True)


def revert_files(files: Sequence[FilePatch], root: Path) -> None:
    """Restore the original bytes of the repaired files."""
    _swap(files, root, forward=False)
