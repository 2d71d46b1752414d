"""Statement parameters as drivers' instrumentations send them (``db.statement.parameters``: the ``repr`` of a tuple,
list or dict), read as literals, never evaluated; and a plain attribute value as text."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import sys
import tokenize
import warnings
from typing import Any

from processors.model.events import Scalar


def to_text(value: Any) -> str:
    """A plain value as text; lists and dicts become compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def plain_scalar(value: Any) -> Scalar:
    """A plain value as a ``Scalar``: lists and dicts as compact JSON, anything else not scalar as its ``repr``."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return to_text(value) if isinstance(value, list | dict) else repr(value)


_ATOM = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?![0-9eEjJxXoObB_.])|'[^'\\\n\r]*'|None|True|False"
# A flat tuple or list of numbers, plain single-quoted strings, None/True/False, as ``repr`` writes them: this
# shape is parsed here without ``ast``; anything else (dicts, nesting, escapes, exponents ...) goes to ast.
_FLAT = re.compile(rf"\((?:(?:{_ATOM})(?:, (?:{_ATOM}))*,?)?\)|\[(?:(?:{_ATOM})(?:, ?(?:{_ATOM}))*,?)?\]")
_ATOMS = re.compile(_ATOM)
_NAMED: dict[str, Scalar] = {"None": None, "True": True, "False": False}


def _atom(token: str) -> Scalar:
    if token[0] == "'":
        return token[1:-1]
    if token in _NAMED:
        return _NAMED[token]
    if "." in token:
        return float(token)
    return int(token) if len(token) - (token[0] == "-") <= MAX_INT_DIGITS else token  # see MAX_INT_DIGITS


Params = tuple[tuple[Scalar, ...], tuple[tuple[str, Scalar], ...]]  # (positional, named)


def literal_params(text: str) -> Params:
    """Parse a ``db.statement.parameters`` repr: a flat tuple/list by pattern, else ``ast`` (never eval); see
    ``literal_params_ast``. Both give the same values for the flat shape."""
    if _FLAT.fullmatch(text) is not None:
        return tuple(map(_atom, _ATOMS.findall(text))), ()
    return literal_params_ast(text)


def literal_params_ast(text: str) -> Params:
    """``literal_params`` by ``ast`` alone: ``ast.literal_eval``, and where that refuses the text, its items one by
    one (``_lenient``), so that one value Python's literals cannot express (``Decimal('12.50')``, a datetime, an
    integer past the int-string limit) does not cost the others; text that is not an expression → empty. The
    warning production text can raise, an invalid escape sequence, is not the daemon's: silenced (only text with a
    backslash can raise it, and catching a warning is not cheap)."""
    try:
        with warnings.catch_warnings(action="ignore") if "\\" in text else contextlib.nullcontext():
            value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _lenient(text)
    if isinstance(value, dict):
        return (), tuple([(str(k), plain_scalar(v)) for k, v in value.items()])
    if isinstance(value, tuple | list):
        return tuple(map(plain_scalar, value)), ()
    return (plain_scalar(value),), ()


# Python refuses to turn a decimal text of more digits than this into an int (``sys.get_int_max_str_digits``, a
# guard against quadratic conversions) and back: such a value is kept as its exact text, which compares as a number
# (``processors.sql.values``) and names the same row (``entity_key``) as the integer would.
MAX_INT_DIGITS = sys.int_info.default_max_str_digits
_HUGE_INT = re.compile(rf"[0-9][0-9_]{{{MAX_INT_DIGITS},}}")
# A call of one of these on a string literal stands for that string: ``Decimal('12.50')``, ``UUID('…')``.
_TEXT_CALLS = frozenset({"Decimal", "UUID"})


def _lenient(text: str) -> Params:
    """The items of a tuple, list or dict repr that ``ast.literal_eval`` refused as a whole: each item a literal
    where it is one, the string of ``Decimal('…')`` / ``UUID('…')``, else its source text (the value is kept as the
    driver wrote it, never evaluated); integer literals past ``MAX_INT_DIGITS`` become their text. Text that does
    not parse as one Python expression, or one expression that is none of these → empty."""
    try:
        source = _quote_huge_ints(text).strip()
        with warnings.catch_warnings(action="ignore"):
            tree = ast.parse(source, mode="eval").body
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, tokenize.TokenError):
        return (), ()
    if isinstance(tree, ast.Dict):
        return (), tuple(
            [(_item_text(k, source), _item(v, source)) for k, v in zip(tree.keys, tree.values, strict=True)]
        )
    if isinstance(tree, ast.Tuple | ast.List):
        return tuple([_item(e, source) for e in tree.elts]), ()
    value = _item(tree, source, as_text=False)  # one value, not a list of them: text that is code is nothing
    return ((value,), ()) if value is not _NOT_A_VALUE else ((), ())


def _quote_huge_ints(text: str) -> str:
    """``text`` with every integer literal of more than ``MAX_INT_DIGITS`` digits written as a string literal of
    its digits (found by Python's tokenizer, so digits inside strings stay as they are)."""
    if _HUGE_INT.search(text) is None:
        return text
    out: list[str] = []
    last, offsets = 0, [0]
    for line in text.splitlines(keepends=True):
        offsets.append(offsets[-1] + len(line))
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NUMBER and _HUGE_INT.fullmatch(tok.string):
            start = offsets[tok.start[0] - 1] + tok.start[1]
            out += (text[last:start], repr(tok.string.replace("_", "")))
            last = start + len(tok.string)
    return "".join(out) + text[last:]


_NOT_A_VALUE: Any = object()


def _item(node: ast.expr | None, source: str, *, as_text: bool = True) -> Scalar:
    """One item's value (see ``_lenient``); an item that is no literal is its source text (``as_text``), else
    ``_NOT_A_VALUE``."""
    if node is None:  # ``{**x}``
        return None
    try:
        return plain_scalar(ast.literal_eval(node))
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in _TEXT_CALLS
        and len(node.args) == 1
        and not node.keywords
        and isinstance(arg := node.args[0], ast.Constant)
        and isinstance(arg.value, str)
    ):
        return arg.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub | ast.UAdd)
        and isinstance(node.operand, ast.Constant)
        and isinstance(digits := node.operand.value, str)
        and _HUGE_INT.fullmatch(digits)
    ):
        return "-" + digits if isinstance(node.op, ast.USub) else digits  # a huge negative integer, quoted
    return _item_text(node, source) if as_text else _NOT_A_VALUE


def _item_text(node: ast.expr | None, source: str) -> str:
    if node is None:
        return ""
    if isinstance(node, ast.Constant):
        return str(node.value)
    return ast.get_source_segment(source, node) or ""
