"""Untrusted data → Python literal source, and nothing else.

Every value that comes from telemetry (parameters, row images, statement text, function names) reaches a generated
test only through :func:`literal`: scalars are rendered with ``repr`` of plain ``str``/``int``/``float``/``bool``/
``None``, containers are laid out around them, and the result is parsed back (``ast.literal_eval``) and compared
with the input before libcst turns it into an expression node. Nothing is ever formatted into code.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import Any

import libcst as cst

INDENT = "    "
_INLINE = 100  # containers whose one-line form is shorter than this stay on one line
_ROW = 400  # ... and the rows of a top-level list or dict (one step, one session per line)


class LiteralError(ValueError):
    """A value that cannot be emitted as a plain Python literal."""


def plain(value: Any) -> Any:
    """The value as plain literal data: tuples → lists, non-finite floats → None, other types rejected."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)  # int subclasses (IntEnum) as plain ints
    if isinstance(value, str):
        return str.__str__(value)  # str subclasses (StrEnum) as plain strings
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        out: dict[str | int, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise LiteralError(f"unsupported key type {type(k).__name__}")
            out[k] = plain(v)
        return out
    raise LiteralError(f"unsupported value type {type(value).__name__}")


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, bool | str):
        return repr(value)
    if isinstance(value, int | float):
        return repr(value)
    raise LiteralError(f"unsupported value type {type(value).__name__}")


def _render(value: Any, depth: int) -> str:
    if isinstance(value, list):
        items = [_render(v, depth + 1) for v in value]
        opening, closing = "[", "]"
    elif isinstance(value, dict):
        items = [f"{_scalar(k)}: {_render(v, depth + 1)}" for k, v in value.items()]
        opening, closing = "{", "}"
    else:
        return _scalar(value)
    inline = opening + ", ".join(items) + closing
    if "\n" not in inline and (len(inline) <= _INLINE or (depth == 1 and len(inline) <= _ROW)):
        return inline
    pad = INDENT * (depth + 1)
    return opening + "\n" + "".join(f"{pad}{item},\n" for item in items) + INDENT * depth + closing


def literal_source(value: Any, depth: int = 0) -> str:
    """Source text of a literal equal to ``plain(value)``; verified by parsing it back."""
    data = plain(value)
    text = _render(data, depth)
    tree = ast.parse(text, mode="eval")
    if not _only_literals(tree.body) or ast.literal_eval(text) != data or not _same_types(ast.literal_eval(text), data):
        raise LiteralError("rendered literal does not round-trip")  # pragma: no cover - defensive
    return text


def _only_literals(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, int | float)
    if isinstance(node, ast.List):
        return all(_only_literals(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and _only_literals(k) for k in node.keys) and all(
            _only_literals(v) for v in node.values
        )
    return False


def _same_types(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_types(a[k], b[k]) for k in a)
    return True


def literal(value: Any, depth: int = 0) -> cst.BaseExpression:
    """A libcst expression node for ``value`` (see :func:`literal_source`)."""
    return cst.parse_expression(literal_source(value, depth))


def string(text: str) -> cst.SimpleString:
    """A libcst string node for untrusted text."""
    node = cst.parse_expression(literal_source(text))
    assert isinstance(node, cst.SimpleString)
    return node


def check_module(source: str) -> None:
    """Raise SyntaxError unless ``source`` is a valid Python module."""
    compile(ast.parse(source), "<generated repro>", "exec")
