"""A bound WHERE tree (``processors.sql.predicate``) written back as SQL for people: ``value % 3 = 0 AND name LIKE
'a%'``, the span's parameters as literals, ``?`` for one it did not carry and ``…`` for a part not understood.

For incidents and the graph, never for a database: the text is not executed. Trees may come from the internal topic,
so anything unexpected is written ``…`` rather than raising.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from processors.model.events import Predicate
from processors.sql.predicate import MAX_DEPTH
from processors.sql.predicate import NODE_TYPES as _NODES

_UNKNOWN: Final = "…"
# PostgreSQL's operator precedence, loosest first: an operand looser than its operator is parenthesised.
_PRECEDENCE: Final = {"or": 1, "and": 2, "not": 3, "isnull": 4, "istrue": 4, "isfalse": 4, "distinct": 4, "cmp": 5,
                      "like": 6, "in": 6, "+": 7, "-": 7, "*": 8, "/": 8, "%": 8}  # fmt: skip
_NEGATABLE: Final = frozenset({"isnull", "istrue", "isfalse", "distinct", "in", "like"})  # x IS NOT NULL, x NOT IN
_TYPES: Final = {"int": "integer", "num": "numeric", "float": "double precision", "text": "text", "bool": "boolean",
                 "timestamp": "timestamp"}  # fmt: skip


def _precedence(node: Any) -> int:
    if type(node) not in _NODES or not node:
        return 10
    if node[0] == "arith" and len(node) == 4:
        return _PRECEDENCE.get(node[1], 10)
    return _PRECEDENCE.get(node[0], 10)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


class _Writer:
    __slots__ = ("boxes",)

    def __init__(self, boxes: Sequence[Any]) -> None:
        self.boxes = boxes

    def operand(self, node: Any, depth: int, parent: int, right: bool = False) -> str:
        """``node`` as an operand of an operator of precedence ``parent`` (on its right: ``a - (b - c)``)."""
        text = self.sql(node, depth)
        own = _precedence(node)
        return f"({text})" if own < parent or (right and own == parent and parent >= 5) else text

    def sql(self, node: Any, depth: int, negate: bool = False) -> str:
        """``node`` as SQL; with ``negate``, its negation (only for the kinds in ``_NEGATABLE``)."""
        if depth > MAX_DEPTH or type(node) not in _NODES or not node:
            return _UNKNOWN
        kind, args, d = node[0], node[1:], depth + 1
        if kind == "col" and len(args) == 1:
            return str(args[0])
        if kind == "$" and len(args) == 1 and type(args[0]) is int and 0 <= args[0] < len(self.boxes):
            box = self.boxes[args[0]]
            return _literal(box[0]) if type(box) in _NODES and len(box) == 1 else "?"
        if kind in ("int", "num") and len(args) == 1:
            return str(args[0])
        if kind in ("str", "bool") and len(args) == 1:
            return _literal(args[0])
        if kind == "null":
            return "NULL"
        p, no = _precedence(node), " NOT" if negate else ""
        if kind in ("and", "or") and args:
            return f" {kind.upper()} ".join(self.operand(a, d, p) for a in args)
        if kind == "not" and len(args) == 1:
            inner = args[0]
            if type(inner) in _NODES and inner and inner[0] in _NEGATABLE:
                return self.sql(inner, d, negate=True)
            return f"NOT {self.operand(inner, d, 9)}"
        if kind in ("cmp", "arith") and len(args) == 3:
            return f"{self.operand(args[1], d, p)} {args[0]} {self.operand(args[2], d, p, right=True)}"
        if kind in ("isnull", "istrue", "isfalse") and len(args) == 1:
            return f"{self.operand(args[0], d, 6)} IS{no} {kind[2:].upper()}"
        if kind == "distinct" and len(args) == 2:
            return f"{self.operand(args[0], d, 6)} IS{no} DISTINCT FROM {self.operand(args[1], d, 6)}"
        if kind == "in" and args:
            return f"{self.operand(args[0], d, p)}{no} IN ({', '.join(self.sql(a, d) for a in args[1:])})"
        if kind == "like" and len(args) == 4:
            op = "ILIKE" if args[0] is True else "LIKE"
            escape = "" if list(args[3]) == ["str", "\\"] else f" ESCAPE {self.sql(args[3], d)}"
            return f"{self.operand(args[1], d, p)}{no} {op} {self.operand(args[2], d, p, right=True)}{escape}"
        if kind == "neg" and len(args) == 1:
            return f"-{self.operand(args[0], d, 9)}"
        if kind == "cast" and len(args) == 2:
            return f"CAST({self.sql(args[1], d)} AS {_TYPES.get(args[0], _UNKNOWN)})"
        if kind == "fn" and len(args) == 2:
            return f"{args[0]}({self.sql(args[1], d)})"
        if kind in ("coalesce", "nullif"):
            return f"{kind}({', '.join(self.sql(a, d) for a in args)})"
        if kind == "date_trunc" and len(args) == 2:
            return f"date_trunc({_literal(args[0])}, {self.sql(args[1], d)})"
        return _UNKNOWN


# Bound trees that many accesses hold (``processors.sql.unkeyed``: a statement bound without parameters), by their
# identity (held, so an id is not reused), with their text: written once.
_SHARED: dict[int, tuple[Predicate, str]] = {}


def where_text(predicate: Predicate) -> str:
    """The WHERE, as SQL text with the span's values in it."""
    shared = _SHARED.get(id(predicate))
    if shared is not None and shared[0] is predicate:
        return shared[1]
    tree, boxes = predicate
    text = _conjunction(tree, boxes) if type(tree) is tuple and tree and tree[0] == "and" else _comparison(tree, boxes)
    return text if text is not None else _Writer(boxes).sql(tree, 0)


def _conjunction(tree: tuple[Any, ...], boxes: Sequence[Any]) -> str | None:
    """An AND of :func:`_comparison` terms as :class:`_Writer` writes it, else None."""
    texts = []
    for term in tree[1:]:
        text = _comparison(term, boxes)
        if text is None:
            return None
        texts.append(text)
    return " AND ".join(texts) if texts else None


def _comparison(node: Any, boxes: Sequence[Any]) -> str | None:
    """``column op value`` of a ``("cmp", op, ("col", c), ("$", i))`` node as :class:`_Writer` writes it, else None.

    Most WHEREs are one such comparison or an AND of them (``id = 5 AND version = 3``), and stage 1 writes one per
    predicate access: this skips the writer's walk for them (no operand needs parentheses: a column and a
    parameter bind tighter than any operator, and a comparison tighter than AND)."""
    if type(node) is not tuple or len(node) != 4 or node[0] != "cmp":
        return None
    _, op, column, param = node
    if type(column) is not tuple or len(column) != 2 or column[0] != "col":
        return None
    if type(param) is not tuple or len(param) != 2 or param[0] != "$":
        return None
    index = param[1]
    if type(index) is not int or not 0 <= index < len(boxes):
        return None
    box = boxes[index]
    return f"{column[1]!s} {op} {_literal(box[0]) if type(box) in _NODES and len(box) == 1 else '?'}"


def share_where(predicate: Predicate) -> None:
    """Keep ``predicate``'s text for :func:`where_text` (until :func:`forget_shared`)."""
    _SHARED[id(predicate)] = (predicate, _Writer(predicate[1]).sql(predicate[0], 0))


def forget_shared() -> None:
    _SHARED.clear()


__all__ = ["forget_shared", "share_where", "where_text"]
