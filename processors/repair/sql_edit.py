"""A statement edit and its mechanics: psycopg text to sqlglot AST and back, token offsets, and the agreement check.

Statements use psycopg's positional ``%s`` placeholders: :func:`parse` numbers them ``$n`` for sqlglot and
:func:`render` turns them back into ``%s`` (a literal ``%`` into ``%%``), reporting the order of the ``n``. A
rewrite edits the AST and, separately, lists minimal text insertions at token offsets of the recorded text;
:func:`finish` applies the insertions and refuses the edit (:class:`RewriteError`) unless the edited text re-parses
to the edited AST and every placeholder is accounted for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import SqlglotError
from sqlglot.tokenizer_core import Token

from processors.sql import number_qmarks, psycopg_to_qmark

DIALECT: Final = "postgres"
_PLAIN_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_]*")
_NAMED: Final = re.compile(r"(?<!%)%\([A-Za-z_][A-Za-z0-9_]*\)[sbt]")  # psycopg's pyformat, as SQLAlchemy renders


class RewriteError(ValueError):
    """The statement cannot be rewritten into the requested protected form."""


@dataclass(frozen=True, slots=True)
class CopyParam:
    """Bind a new placeholder to the same value as an existing one (0-based among the original placeholders)."""

    index: int


@dataclass(frozen=True, slots=True)
class VarParam:
    """Bind a new placeholder to a variable the code has in scope: the row ``version`` read, or the ``key``."""

    role: str  # version | idempotency_key


ParamSource = CopyParam | VarParam


@dataclass(frozen=True, slots=True)
class SqlEdit:
    """One statement rewritten: the recorded text, its protected text, and how to get from one to the other."""

    before: str
    after: str  # the recorded text with the insertions: what the repaired code runs
    canonical: str  # the edited AST rendered by sqlglot (postgres, ``%s`` placeholders)
    insertions: tuple[tuple[int, str], ...]  # (offset into ``before``, text), ascending
    new_params: tuple[tuple[int, ParamSource], ...]  # (index among ``after``'s placeholders, value)


# -- text and AST --------------------------------------------------------------------------------------------------
def parse(statement: str) -> exp.Expression:
    """One statement with positional ``%s`` placeholders → its sqlglot AST (placeholders as ``$n``). A named one
    (``%(pk_1)s``, as SQLAlchemy renders a statement) counts as the next positional one: the statement's shape is
    what a rewrite needs; a rewrite that adds a parameter is refused (:func:`finish`)."""
    positional = _NAMED.sub("%s", statement)
    if "%(" in positional:
        raise RewriteError("named placeholders are not supported")
    try:
        trees = sqlglot.parse(number_qmarks(psycopg_to_qmark(positional), DIALECT), dialect=DIALECT)
    except (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as exc:
        raise RewriteError(f"unparseable statement: {exc}") from exc
    found = [t for t in trees if isinstance(t, exp.Expression)]
    if len(found) != 1:
        raise RewriteError("expected exactly one statement")
    return found[0]


def render(tree: exp.Expression) -> tuple[str, list[int]]:
    """An AST → psycopg text (``$n`` → ``%s``, literal ``%`` → ``%%``) and the ``n`` of each placeholder in order."""
    text = tree.sql(dialect=DIALECT)
    tokens = Dialect.get_or_raise(DIALECT).tokenize(text)
    out: list[str] = []
    order: list[int] = []
    last = 0
    for tok, nxt in zip(tokens, [*tokens[1:], None], strict=True):
        if tok.token_type == TokenType.PARAMETER and nxt is not None and nxt.token_type == TokenType.NUMBER:
            out += (text[last : tok.start].replace("%", "%%"), "%s")
            order.append(int(nxt.text))
            last = nxt.end + 1
    out.append(text[last:].replace("%", "%%"))
    return "".join(out), order


def placeholders(statement: str) -> int:
    """How many positional placeholders a statement has."""
    return len(render(parse(statement))[1])


def identifier(name: str) -> exp.Identifier:
    """A column name from configuration or code as a sqlglot identifier, quoted unless plainly lower-case."""
    return exp.to_identifier(name, quoted=_PLAIN_IDENTIFIER.fullmatch(name) is None)


def param(n: int) -> exp.Parameter:
    """Placeholder ``$n`` (1-based)."""
    return exp.Parameter(this=exp.Literal(this=str(n), is_string=False))


def finish(
    statement: str, after: exp.Expression, insertions: list[tuple[int, str]], params: dict[int, ParamSource]
) -> SqlEdit:
    """Apply the insertions and check them against the edited AST; place the new parameters (refused in a statement
    with named placeholders: a positional one cannot join them)."""
    if params and _NAMED.search(statement):
        raise RewriteError("named placeholders: a new parameter cannot be added")
    ordered = sorted(insertions, key=lambda i: i[0])
    text = statement
    for at, piece in reversed(ordered):
        text = text[:at] + piece + text[at:]
    canonical, order = render(after)
    if render(parse(text))[0] != canonical:
        raise RewriteError("the text rewrite does not match the AST rewrite")
    if any(n not in order for n in params) or len(order) != placeholders(statement) + len(params):
        raise RewriteError("the rewrite lost or duplicated a placeholder")
    new_params = tuple((order.index(n), source) for n, source in sorted(params.items()))
    return SqlEdit(statement, text, canonical, tuple(ordered), new_params)


# -- token offsets in the recorded text ----------------------------------------------------------------------------
def tokens_of(statement: str) -> list[Token]:
    """The statement's tokens (with their offsets in the text)."""
    try:
        return list(Dialect.get_or_raise(DIALECT).tokenize(statement))
    except SqlglotError as exc:
        raise RewriteError(f"untokenizable statement: {exc}") from exc


def depths(tokens: Sequence[Token]) -> list[int]:
    """The parenthesis depth of each token (a paren counts as outside the group it opens or closes)."""
    depth, out = 0, []
    for t in tokens:
        if t.token_type == TokenType.R_PAREN:
            depth -= 1
        out.append(depth)
        if t.token_type == TokenType.L_PAREN:
            depth += 1
    return out


def statement_end(tokens: Sequence[Token]) -> int:
    """Offset right after the statement's last token (before a trailing ``;``)."""
    body = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    if not body:
        raise RewriteError("empty statement")
    return body[-1].end + 1


def clause_end(tokens: Sequence[Token]) -> int:
    """Offset where the WHERE clause ends: right after the token before a top-level RETURNING, else the end."""
    for i, (t, depth) in enumerate(zip(tokens, depths(tokens), strict=True)):
        if depth == 0 and t.token_type == TokenType.RETURNING and i > 0:
            return tokens[i - 1].end + 1
    return statement_end(tokens)


def and_terms(node: exp.Expression) -> list[exp.Expression]:
    """The terms of ``a AND (b AND c)``."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return and_terms(node.this) + and_terms(node.expression)
    return [node]


def conjunction(terms: list[exp.Expression]) -> exp.Expression:
    """``a AND b AND c`` as the parser builds it (left-deep, no added parentheses)."""
    out = terms[0]
    for term in terms[1:]:
        out = exp.And(this=out, expression=term)
    return out
