"""Code edits keyed by libcst node identity, rendered into new file contents.

Strategies request edits against the original trees of a :class:`~processors.repair.source.SourceIndex` (SQL text
inserted at offsets of the recorded statement, parameters, comments, statements after a statement, a retry loop);
:meth:`Patch.render` applies them by one transformer pass per file, so everything the edits do not touch keeps its
bytes, and checks that each repaired file compiles. SQL text goes into the literal or constant that holds that
part of the statement (a constant is edited only when every use of it gets the same edit), next to it, or, inside
an opaque value, replaces the whole SQL argument. The node builders are in :mod:`processors.repair.edits`.
A repair may also create a file (a migration): :meth:`Patch.create`, rendered with no bytes before.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import libcst as cst

from processors.repair.edits import (
    LOOP_NAMES,
    Edit,
    becomes,
    beside,
    comment_lines,
    edited_in_place,
    insert_text,
    names_in,
    retry_loop,
    split_sql,
    string_literal,
    with_imports,
    with_leading,
    with_params,
)
from processors.repair.file_patch import PatchError
from processors.repair.locate import CallSite, Piece, map_offset
from processors.repair.source import Constant, SourceIndex

_ConstantUse = tuple[Path, Piece, frozenset[tuple[int, str]]]  # where, the piece at the call site, insertions


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


def _compiles(path: Path, data: bytes) -> None:
    try:
        compile(data, str(path), "exec")
    except SyntaxError as exc:  # a bug here, never a broken patch for the developer
        raise PatchError(f"the repaired {path} does not compile: {exc}") from exc


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
        self.created: dict[Path, bytes] = {}  # new files (a migration), in the order requested

    # -- requests --------------------------------------------------------------------------------------------
    def sql(self, site: CallSite, recorded: str, insertions: Sequence[tuple[int, str]]) -> None:
        """Insert SQL text into the statement ``site`` runs (offsets into the recorded statement)."""
        code = site.text
        moved = [(map_offset(recorded, code, at), text) for at, text in insertions]
        choices = [_choose(site.pieces, at) for at, _ in moved]
        if any(c is None for c in choices):  # inside an opaque value: replace the whole SQL argument
            node = site.call.args[0].value
            self._wholes[id(node)] = (site.path, node, insert_text(code, moved))
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
                next_to = self._beside.setdefault(id(piece.node), (site.path, piece.node, [], []))
                texts = next_to[3] if kind == "append" else next_to[2]
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

    def create(self, path: Path, data: bytes) -> None:
        """Create the file ``path`` (absolute, under the index's root) holding ``data``; refused when it exists."""
        if path.exists():
            raise PatchError(f"{path} exists already: not creating it")
        if self.created.setdefault(path, data) != data:
            raise PatchError(f"{path} is created twice, with different contents")

    def retry(self, path: Path, block: cst.With, setup: cst.BaseStatement, comment: str) -> None:
        """Run the ``with ...transaction()`` block in a retry loop on serialization failures, ``setup`` first."""
        func = self._enclosing_def(path, block)
        taken = {n.value for n in names_in(func)} if func is not None else set()
        var = next((n for n in LOOP_NAMES if n not in taken), None)
        if var is None:
            raise PatchError("no free name for the retry loop variable")
        self._retries.setdefault(id(block), (path, block, setup, var, comment))
        self._imports.setdefault(path, set()).add("psycopg")

    # -- rendering -------------------------------------------------------------------------------------------
    def render(self) -> list[tuple[Path, bytes | None, bytes]]:
        """(path, before, after) for every file the edits change or create (before None)."""
        edits: dict[Path, dict[int, list[Edit]]] = {}
        after: dict[Path, dict[int, list[cst.BaseStatement]]] = {}

        def add(path: Path, node: cst.CSTNode, edit: Edit) -> None:
            edits.setdefault(path, {}).setdefault(id(node), []).append(edit)

        self._resolve_constants()
        for path, literal, inserted in self._literals.values():
            value = literal.evaluated_value
            assert isinstance(value, str)
            ordered = sorted(inserted)
            edited = edited_in_place(literal, ordered)
            add(path, literal, becomes(self._fit(path, literal, insert_text(value, ordered), edited)))
        for path, node, ahead, behind in self._beside.values():
            add(path, node, partial(beside, before="".join(ahead), after="".join(behind)))
        for path, node, text in self._wholes.values():
            add(path, node, becomes(string_literal(text)))
        for path, params, values in self._params.values():
            add(path, params, partial(with_params, values=values))
        for path, statement, texts in self._comments.values():
            lines = [line for t in texts for line in comment_lines(t, self._column(path, statement), self.line_length)]
            add(path, statement, partial(with_leading, lines=lines))
        for path, block, setup, var, text in self._retries.values():
            lines = comment_lines(text, self._column(path, block), self.line_length)
            add(path, block, partial(retry_loop, setup=setup, var=var, lines=lines))
        for node_id, (path, generic) in self._edits.items():
            edits.setdefault(path, {}).setdefault(node_id, []).extend(generic.values())
        for node_id, (path, new) in self._after.items():
            after.setdefault(path, {})[node_id] = list(new.values())
        out: list[tuple[Path, bytes | None, bytes]] = []
        for path, data in self.created.items():
            if path.suffix == ".py":
                _compiles(path, data)
            out.append((path, None, data))
        for path in sorted(set(edits) | set(after) | set(self._imports)):
            module = self.index.module(path)
            updated = module.visit(_Rewriter(edits.get(path, {}), after.get(path, {})))
            assert isinstance(updated, cst.Module)
            updated = with_imports(updated, self._imports.get(path, set()))
            _compiles(path, updated.bytes)
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
                    next_to = self._beside.setdefault(id(piece.node), (path, piece.node, [], []))
                    side = next_to[3] if offsets == {len(piece.text)} else next_to[2]
                    side.extend(t for t in ordered if t not in side)
                else:
                    self._wholes[id(piece.node)] = (path, piece.node, insert_text(piece.text, sorted(texts)))

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
        chunks = split_sql(text, self.line_length - column - 2, tail)
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
