"""The libcst building blocks of a patch: new nodes that round-trip, and the edits a :class:`Patch` applies.

Every new string literal comes from :func:`string_literal` (built from ``repr`` and checked to evaluate back to the
intended text) or :func:`edited_in_place` (the developer's own literal with text inserted, when that is provably
safe); SQL text never becomes code any other way. A long literal is cut before clause keywords
(:func:`split_sql`); comments are wrapped to the line length; the retry loop is parsed from a fixed template whose
only variable part is a loop name from a fixed list. An :data:`Edit` maps a node to its replacement.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from typing import Final

import libcst as cst
from sqlglot import TokenType
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError

from processors.repair.file_patch import PatchError

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
LOOP_NAMES: Final = ("attempt", "_attempt", "retry_attempt")

Edit = Callable[[cst.CSTNode], cst.CSTNode]


# -- new text ----------------------------------------------------------------------------------------------------
def string_literal(text: str) -> cst.SimpleString:
    """A string literal whose value is exactly ``text`` (double-quoted when that needs no escaping)."""
    code = repr(text)
    if code.startswith("'") and '"' not in text and "'" not in text:
        code = '"' + code[1:-1] + '"'
    node = cst.SimpleString(code)
    if node.evaluated_value != text:
        raise PatchError("a string literal does not round-trip")
    return node


def edited_in_place(node: cst.SimpleString, insertions: Sequence[tuple[int, str]]) -> cst.SimpleString | None:
    """The literal with the text inserted into its own source (quotes, prefix, line breaks kept), when that is safe:
    the literal has no escapes, the inserted text has no quote, backslash or line break, and it round-trips."""
    body, value = node.raw_value, node.evaluated_value
    if body != value or any(c in text for _, text in insertions for c in "\\\"'\r\n"):
        return None
    candidate = cst.SimpleString(node.prefix + node.quote + insert_text(body, insertions) + node.quote)
    try:
        same = candidate.evaluated_value == insert_text(body, insertions)
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


def insert_text(text: str, insertions: Sequence[tuple[int, str]]) -> str:
    """``text`` with each ``(offset, piece)`` inserted (offsets into the original ``text``)."""
    for at, piece in sorted(insertions, key=lambda i: i[0], reverse=True):
        text = text[:at] + piece + text[at:]
    return text


def split_sql(text: str, width: int, tail: int) -> list[str]:
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


def names_in(node: cst.CSTNode) -> list[cst.Name]:
    """Every ``Name`` under ``node``."""
    out: list[cst.Name] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.Name):
            out.append(n)
        stack.extend(n.children)
    return out


# -- edits -------------------------------------------------------------------------------------------------------
def becomes(replacement: cst.CSTNode) -> Edit:
    """The edit that replaces a node by ``replacement``."""

    def edit(_: cst.CSTNode) -> cst.CSTNode:
        return replacement

    return edit


def beside(node: cst.CSTNode, *, before: str, after: str) -> cst.CSTNode:
    """``"before" + node + "after"`` (either side left out when empty)."""
    assert isinstance(node, cst.BaseExpression)
    result: cst.BaseExpression = node
    if after:
        result = cst.BinaryOperation(left=result, operator=cst.Add(), right=string_literal(after))
    if before:
        result = cst.BinaryOperation(left=string_literal(before), operator=cst.Add(), right=result)
    return result


def with_params(node: cst.CSTNode, *, values: dict[int, cst.BaseExpression]) -> cst.CSTNode:
    """The parameter tuple or list with ``values`` inserted at their indices."""
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


def with_leading(node: cst.CSTNode, *, lines: list[cst.EmptyLine]) -> cst.CSTNode:
    """The statement with ``lines`` (comments) added after its own leading lines."""
    if isinstance(node, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        return node.with_changes(leading_lines=[*node.leading_lines, *lines])
    return node


def retry_loop(node: cst.CSTNode, *, setup: cst.BaseStatement, var: str, lines: list[cst.EmptyLine]) -> cst.CSTNode:
    """``with ...:`` → ``for var in range(3): try: with ...: <setup> ...; break; except SerializationFailure``."""
    assert isinstance(node, cst.With) and isinstance(node.body, cst.IndentedBlock)
    inner = node.with_changes(leading_lines=(), body=node.body.with_changes(body=[setup, *node.body.body]))
    loop = cst.parse_statement(_RETRY.replace("attempt", var))  # var is one of LOOP_NAMES
    assert isinstance(loop, cst.For) and isinstance(loop.body, cst.IndentedBlock)
    attempt = loop.body.body[0]
    assert isinstance(attempt, cst.Try) and isinstance(attempt.body, cst.IndentedBlock)
    attempt = attempt.with_changes(body=attempt.body.with_changes(body=[inner, attempt.body.body[1]]))
    return loop.with_changes(body=loop.body.with_changes(body=[attempt]), leading_lines=[*node.leading_lines, *lines])


def with_imports(module: cst.Module, names: set[str]) -> cst.Module:
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
