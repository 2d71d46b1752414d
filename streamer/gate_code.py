"""Which added lines of a diff name an event in *code*, not in a comment or a docstring: the gate's "emits" test.

A line whose only mention of the event is ``# emits split.rounded``, ``// split.rounded``, or a docstring does not
emit it, so the gate must not count it. Python files are read with :mod:`tokenize`: each run of consecutive added
lines is tokenized as one block (a docstring added whole is one string token, however many lines it spans); a
mention counts when it lies in a token that is neither a comment nor a string standing alone as a statement (a
docstring, or a string literal used as a comment). A block that does not tokenize (a hunk that starts inside a
bracket or a string) is read line by line, each line's tokens as far as they go. Other files follow a simpler rule:
the text after ``//`` or ``#`` outside quotes is a comment, and so is a line that starts a block comment or
continues one (``/*``, ``*``, ``*/``, ``<!--``).
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterable, Sequence

from streamer.diffs import DiffLine

_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER, tokenize.COMMENT}
PROOF_MATERIAL = (".trace-repro/", ".gitlab/", ".gitlab-ci.yml")  # the contract and the CI job: not the fix
_BLOCK_COMMENT = re.compile(r"^\s*(?:/\*|\*|<!--)")


def is_test_path(path: str) -> bool:
    """Test files by the usual conventions: a tests/test/spec directory, test_*.py, *_test.*, *.test.*, *Test.*"""
    parts = path.split("/")
    name = parts[-1]
    return (
        any(p in ("tests", "test", "spec", "__tests__") for p in parts[:-1])
        or name.startswith("test_")
        or bool(re.search(r"(?:_test|\.test|\.spec|Test|Tests)\.\w+$", name))
    )


def is_code(path: str) -> bool:
    """A file that can emit the event: not a test, not the contract or CI job committed with the fix."""
    return not is_test_path(path) and not path.startswith(PROOF_MATERIAL)


def mentions(name: str, text: str) -> bool:
    """``name`` as a whole word of ``text`` (not a part of a longer dotted or word name)."""
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def _runs(lines: Sequence[DiffLine]) -> list[list[DiffLine]]:
    """The added lines grouped into runs of consecutive line numbers of one file."""
    runs: list[list[DiffLine]] = []
    for line in lines:
        if runs and runs[-1][-1].path == line.path and runs[-1][-1].number + 1 == line.number:
            runs[-1].append(line)
        else:
            runs.append([line])
    return runs


def _tokens(source: str) -> tuple[list[tokenize.TokenInfo], bool]:
    """The tokens of ``source`` as far as they go, and whether all of it tokenized."""
    out: list[tokenize.TokenInfo] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            out.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return out, False
    return out, True


def _blank(lines: list[str], tok: tokenize.TokenInfo) -> None:
    """Replace the text ``tok`` covers in ``lines`` with spaces."""
    (r0, c0), (r1, c1) = tok.start, tok.end
    for row in range(r0, r1 + 1):
        if not 1 <= row <= len(lines):
            continue
        text = lines[row - 1]
        a = c0 if row == r0 else 0
        b = c1 if row == r1 else len(text)
        lines[row - 1] = text[:a] + " " * (b - a) + text[b:]


def _code_text(source_lines: list[str], tokens: Iterable[tokenize.TokenInfo]) -> list[str]:
    """``source_lines`` with comments and lone strings (docstrings) blanked out."""
    lines = list(source_lines)
    statement: list[tokenize.TokenInfo] = []  # the significant tokens of the current logical line
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            _blank(lines, tok)
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if len(statement) == 1 and statement[0].type == tokenize.STRING:
                _blank(lines, statement[0])
            statement = []
        elif tok.type not in _SKIP:
            statement.append(tok)
    if len(statement) == 1 and statement[0].type == tokenize.STRING:  # the block ended inside that statement
        _blank(lines, statement[0])
    return lines


def _python_code(run: Sequence[DiffLine]) -> list[str]:
    lines = _dedent(run)
    tokens, complete = _tokens("\n".join(lines) + "\n")
    if complete:
        return _code_text(lines, tokens)
    out = []
    for text in lines:
        tokens, _ = _tokens(text.strip() + "\n")
        out.append(_code_text([text.strip()], tokens)[0])
    return out


def _dedent(run: Sequence[DiffLine]) -> list[str]:
    """The run's lines with the first line's indentation removed (a hunk starts inside a function)."""
    first = run[0].text
    indent = first[: len(first) - len(first.lstrip())]
    return [x.text[len(indent) :] if x.text.startswith(indent) else x.text.lstrip() for x in run]


def _strip_line_comment(text: str) -> str:
    """``text`` without its ``//`` or ``#`` comment (outside single or double quotes)."""
    if _BLOCK_COMMENT.match(text) or text.strip().startswith("*/"):
        return ""
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'`":
            quote = c
        elif c == "#" or text.startswith("//", i):
            return text[:i]
        i += 1
    return text


def code_of(lines: Sequence[DiffLine]) -> list[tuple[DiffLine, str]]:
    """Each added line with its code: the text that is neither a comment nor a docstring (see the module doc)."""
    out: list[tuple[DiffLine, str]] = []
    for run in _runs(lines):
        if run[0].path.endswith((".py", ".pyi")):
            out += zip(run, _python_code(run), strict=True)
        else:
            out += ((line, _strip_line_comment(line.text)) for line in run)
    return out


__all__ = ["PROOF_MATERIAL", "code_of", "is_code", "is_test_path", "mentions"]
