"""A statement's whole WHERE, compiled once per statement shape, and evaluated on row images as PostgreSQL would.

``compile_where`` turns the sqlglot WHERE into a small tree of tuples (``("cmp", "=", ("arith", "%", ("col",
"value"), ("int", 3)), ("int", 0))``) whose placeholders are holes ``("$", i)``: it is parameter-free, so it is
cached with the statement's shape. ``bind`` fills the holes with one span's parameters as *data* (a value, or
nothing when the span does not carry it): a ``Predicate``, plain JSON that rides on the ``Access`` across the
stage hand-off. ``evaluate`` gives the WHERE's truth on an image in three-valued logic (TRUE, FALSE, NULL: a row
is selected only when TRUE), or an :class:`~processors.sql.pgsemantics.Undecidable` with its reason — an unknown
function, a subquery, a parameter the span did not carry, a column the image lacks, a value whose type the image
does not tell — which is never "no match". Trees come back from the internal topic, so evaluation checks their
form and depth and answers ``malformed`` rather than raising.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from sqlglot import exp

from processors.model.events import Predicate, Scalar
from processors.sql import pgsemantics as pg
from processors.sql.pgsemantics import Undecidable, Value
from processors.sql.syntax import OPS, Named, Pos, Unbound, bind, name_of, placeholder

NODE_TYPES: Final = (tuple, list)  # a tree as compiled (tuples), or as JSON left it (lists)
_NODES: Final = NODE_TYPES
MAX_DEPTH: Final = 48  # deeper trees (never written by hand) are undecidable, not a recursion error
_ARITH: Final[dict[type[exp.Expression], str]] = {exp.Add: "+", exp.Sub: "-", exp.Mul: "*", exp.Div: "/", exp.Mod: "%"}
_CASTS: Final = {
    **dict.fromkeys(("INT", "BIGINT", "SMALLINT", "TINYINT"), "int"),
    **dict.fromkeys(("DECIMAL", "BIGDECIMAL"), "num"),
    **dict.fromkeys(("DOUBLE", "FLOAT"), "float"),
    **dict.fromkeys(("TEXT", "VARCHAR"), "text"),
    "BOOLEAN": "bool",
    "TIMESTAMP": "timestamp",
}
_TEXT_FUNCTIONS: Final[dict[type[exp.Expression], str]] = {exp.Lower: "lower", exp.Upper: "upper", exp.Length: "length"}

Node = tuple[Any, ...]
Refs = tuple[Pos | Named, ...]


class _Compiler:
    def __init__(self) -> None:
        self.refs: list[Pos | Named] = []
        self.reasons: set[str] = set()

    def undecidable(self, reason: str) -> Node:
        self.reasons.add(reason)
        return ("?", reason)

    def node(self, n: exp.Expression, depth: int) -> Node:
        if depth > MAX_DEPTH:
            return self.undecidable("too_deep")
        while isinstance(n, exp.Paren) and isinstance(n.this, exp.Expression):
            n = n.this
        d = depth + 1
        ref = placeholder(n)
        if ref is not None:
            self.refs.append(ref)
            return ("$", len(self.refs) - 1)
        if isinstance(n, exp.And | exp.Or):
            operands, stack = [], [n]
            while stack:  # a long AND/OR chain is a deep tree: flattened iteratively
                m = stack.pop()
                while isinstance(m, exp.Paren) and type(m.this) is type(n):
                    m = m.this
                if type(m) is type(n):
                    stack += (m.expression, m.this)
                else:
                    operands.append(self.node(m, d))
            return ("and" if isinstance(n, exp.And) else "or", *operands)
        if isinstance(n, exp.Not):
            return ("not", self.node(n.this, d))
        if isinstance(n, exp.Column):
            return ("col", name_of(n.this)) if isinstance(n.this, exp.Identifier) else self.undecidable("unsupported")
        if isinstance(n, exp.Literal | exp.Null | exp.Boolean | exp.Neg):
            return self.constant(n, d)
        if (op := OPS.get(type(n))) is not None:
            right = n.expression
            if isinstance(right, exp.Any):
                return self.any(op, n.this, right, d)
            return ("cmp", op, self.node(n.this, d), self.node(right, d))
        if (sym := _ARITH.get(type(n))) is not None:
            return ("arith", sym, self.node(n.this, d), self.node(n.expression, d))
        if isinstance(n, exp.Is):
            value = n.expression
            test = "isnull" if isinstance(value, exp.Null) else None
            if isinstance(value, exp.Boolean):
                test = "istrue" if value.this else "isfalse"
            if test is None:
                return self.undecidable("unsupported")
            node: Node = (test, self.node(n.this, d))
            return ("not", node) if n.args.get("negate") else node
        if isinstance(n, exp.NullSafeEQ | exp.NullSafeNEQ):
            distinct = ("distinct", self.node(n.this, d), self.node(n.expression, d))
            return ("not", distinct) if isinstance(n, exp.NullSafeEQ) else distinct
        if isinstance(n, exp.In):
            if any(n.args.get(k) for k in ("query", "unnest", "field")):
                return self.undecidable("subquery")
            return ("in", self.node(n.this, d), *(self.node(e, d) for e in n.expressions))
        if isinstance(n, exp.Between):
            if n.args.get("symmetric"):
                return self.undecidable("unsupported")
            value = self.node(n.this, d)
            low, high = self.node(n.args["low"], d), self.node(n.args["high"], d)
            return ("and", ("cmp", ">=", value, low), ("cmp", "<=", value, high))
        if isinstance(n, exp.Escape | exp.Like | exp.ILike):
            return self.like(n, d)
        return self.function(n, d)

    def constant(self, n: exp.Expression, d: int) -> Node:
        if isinstance(n, exp.Null):
            return ("null",)
        if isinstance(n, exp.Boolean):
            return ("bool", bool(n.this))
        if isinstance(n, exp.Neg):
            return ("neg", self.node(n.this, d))
        if n.is_string:
            return ("str", n.name)
        text = n.name.replace("_", "")
        if text.isascii() and text.isdigit():
            return ("int", text)  # kept as digits: an integer literal of any length stays exact on the wire
        return ("num", text)

    def any(self, op: str, left: exp.Expression, right: exp.Any, d: int) -> Node:
        inner = right.this.this if isinstance(right.this, exp.Paren) else right.this
        if op == "=" and isinstance(inner, exp.Array):
            return ("in", self.node(left, d), *(self.node(e, d) for e in inner.expressions))
        return self.undecidable("array")  # ``= ANY(%s)`` takes a list: the span's parameters hold scalars

    def like(self, n: exp.Expression, d: int) -> Node:
        escape: Node = ("str", "\\")
        if isinstance(n, exp.Escape):
            escape, n = self.node(n.expression, d), n.this
        if not isinstance(n, exp.Like | exp.ILike):
            return self.undecidable("unsupported")
        node = ("like", isinstance(n, exp.ILike), self.node(n.this, d), self.node(n.expression, d), escape)
        return ("not", node) if n.args.get("negate") else node

    def function(self, n: exp.Expression, d: int) -> Node:
        if isinstance(n, exp.Subquery | exp.Exists | exp.Select):
            return self.undecidable("subquery")
        if isinstance(n, exp.Cast):
            to = n.args.get("to")
            kind = _CASTS.get(to.this.name) if isinstance(to, exp.DataType) and not to.expressions else None
            return ("cast", kind, self.node(n.this, d)) if kind else self.undecidable("cast")
        if (name := _TEXT_FUNCTIONS.get(type(n))) is not None:
            return ("fn", name, self.node(n.this, d))
        if isinstance(n, exp.Abs):
            return ("fn", "abs", self.node(n.this, d))
        if isinstance(n, exp.Coalesce):
            return ("coalesce", self.node(n.this, d), *(self.node(e, d) for e in n.expressions))
        if isinstance(n, exp.Nullif):
            return ("nullif", self.node(n.this, d), self.node(n.expression, d))
        if isinstance(n, exp.TimestampTrunc) and isinstance(n.args.get("unit"), exp.Var):
            return ("date_trunc", n.args["unit"].name.lower(), self.node(n.this, d))
        return self.undecidable("unknown_function" if isinstance(n, exp.Func) else "unsupported")


def compile_where(where: exp.Expression | None) -> tuple[Node, Refs, frozenset[str]] | None:
    """The WHERE's tree, its placeholders in hole order, and why parts of it are undecidable; None without one."""
    if isinstance(where, exp.Where):
        where = where.this
    if not isinstance(where, exp.Expression):
        return None
    c = _Compiler()
    try:
        tree = c.node(where, 0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):  # a sqlglot tree of a form not foreseen
        c.refs.clear()
        tree = c.undecidable("unsupported")
    return tree, tuple(c.refs), frozenset(c.reasons)


def bind_where(tree: Node, refs: Refs, params: tuple[Scalar, ...], named: Mapping[str, Scalar]) -> Predicate:
    """The tree with one span's parameters: each hole's value as a one-item tuple, () when the span lacks it."""
    boxes = tuple(() if isinstance(v := bind(r, params, named), Unbound) else (v,) for r in refs)
    return (tree, boxes)


# -- evaluation ------------------------------------------------------------------------------------------------
_MALFORMED: Final = Undecidable("malformed")


class _Evaluator:
    __slots__ = ("boxes", "image")

    def __init__(self, boxes: Sequence[Any], image: Mapping[str, Any]) -> None:
        self.boxes, self.image = boxes, image

    def truth(self, node: Any, depth: int) -> bool | Undecidable | None:
        return pg.truth(self.value(node, depth))

    def value(self, node: Any, depth: int) -> Value:
        if depth > MAX_DEPTH or type(node) not in _NODES or not node:
            return _MALFORMED
        kind, args, d = node[0], node[1:], depth + 1
        if kind == "col":
            if len(args) != 1 or not isinstance(args[0], str):
                return _MALFORMED
            return pg.of_image(self.image[args[0]]) if args[0] in self.image else Undecidable("column_missing")
        if kind == "$":
            i = args[0] if len(args) == 1 else None
            if type(i) is not int or not 0 <= i < len(self.boxes) or type(self.boxes[i]) not in _NODES:
                return _MALFORMED
            box = self.boxes[i]
            return pg.of_image(box[0]) if len(box) == 1 else Undecidable("unbound_parameter")
        if kind in ("int", "num", "str", "bool", "null"):
            return _constant(kind, args)
        if kind == "?":
            return Undecidable(args[0] if len(args) == 1 and args[0] in _REASONS else "malformed")
        if kind in ("and", "or"):
            return _connective(kind == "and", [self.truth(a, d) for a in args])
        if kind == "not":
            t = self.truth(args[0], d) if len(args) == 1 else _MALFORMED
            return (not t) if isinstance(t, bool) else t
        if kind in ("isnull", "istrue", "isfalse") and len(args) == 1:
            v = self.value(args[0], d) if kind == "isnull" else self.truth(args[0], d)
            if isinstance(v, Undecidable):
                return v
            return v is None if kind == "isnull" else v is (kind == "istrue")
        if kind == "in" and args:
            left = self.value(args[0], d)
            return _connective(False, [pg.holds("=", left, self.value(a, d)) for a in args[1:]])
        if len(args) == 3 and kind in ("cmp", "arith") and isinstance(args[0], str):
            a, b = self.value(args[1], d), self.value(args[2], d)
            if kind == "cmp":
                return pg.holds(args[0], a, b)
            return pg.arith(args[0], a, b) if args[0] in ("+", "-", "*", "/", "%") else _MALFORMED
        return self.call(kind, args, d)

    def call(self, kind: Any, args: Sequence[Any], d: int) -> Value:
        if kind == "distinct" and len(args) == 2:
            a, b = self.value(args[0], d), self.value(args[1], d)
            if a is None or b is None:
                return pg.undecidable(a, b) or (a is None) != (b is None)
            eq = pg.holds("=", a, b)
            return (not eq) if isinstance(eq, bool) else eq
        if kind == "neg" and len(args) == 1:
            return pg.negate(self.value(args[0], d))
        if kind == "like" and len(args) == 4:
            value, pattern, escape = (self.value(a, d) for a in args[1:])
            return pg.like(value, pattern, escape, args[0] is True)
        if kind == "cast" and len(args) == 2 and args[0] in ("int", "num", "float", "text", "bool", "timestamp"):
            return pg.cast(args[0], self.value(args[1], d))
        if kind == "fn" and len(args) == 2:
            if args[0] == "abs":
                return pg.absolute(self.value(args[1], d))
            if args[0] in ("lower", "upper", "length"):
                return pg.text_function(args[0], self.value(args[1], d))
        if kind == "date_trunc" and len(args) == 2 and isinstance(args[0], str):
            return pg.date_trunc(args[0], self.value(args[1], d))
        if kind == "coalesce":
            for a in args:
                v = self.value(a, d)
                if v is not None:
                    return v  # an undecidable argument before any known non-NULL one is the answer's
            return None
        if kind == "nullif" and len(args) == 2:
            a, b = self.value(args[0], d), self.value(args[1], d)
            eq = pg.holds("=", a, b)
            return eq if isinstance(eq, Undecidable) else None if eq is True else a
        return _MALFORMED


_REASONS: Final = frozenset({"too_deep", "unsupported", "subquery", "array", "cast", "unknown_function"})


def _constant(kind: str, args: Sequence[Any]) -> Value:
    if kind == "null":
        return None
    if len(args) != 1:
        return _MALFORMED
    v = args[0]
    if kind == "bool":
        return v if isinstance(v, bool) else _MALFORMED
    if kind == "str":
        return v if isinstance(v, str) else _MALFORMED
    if not isinstance(v, str) or not v.isascii():
        return _MALFORMED
    if kind == "int" and v.isdigit():
        return int(v) if len(v) <= 18 else Decimal(v)  # past int8: PostgreSQL types the literal numeric
    number = pg.cast("num", v) if v[:1].isdigit() or v[:1] == "." else _MALFORMED
    return number if isinstance(number, Decimal) else _MALFORMED


def _connective(conjunction: bool, truths: Sequence[bool | Undecidable | Value | None]) -> bool | Undecidable | None:
    """AND (``conjunction``) or OR in three-valued logic: one FALSE (TRUE) decides; else an undecidable operand
    makes it undecidable; else a NULL one makes it NULL."""
    if any(t is (not conjunction) for t in truths):
        return not conjunction
    if (u := pg.undecidable(*truths)) is not None:
        return u
    if any(not isinstance(t, bool) and t is not None for t in truths):
        return _MALFORMED
    return None if any(t is None for t in truths) else conjunction


def evaluate(predicate: Predicate | Sequence[Any], image: Mapping[str, Any]) -> bool | Undecidable | None:
    """The WHERE's truth on ``image``: True, False, None (SQL NULL: the row is not selected) or Undecidable."""
    if len(predicate) != 2 or not isinstance(predicate[1], Sequence):
        return _MALFORMED
    return _Evaluator(predicate[1], image).truth(predicate[0], 0)


__all__ = ["MAX_DEPTH", "NODE_TYPES", "Node", "Refs", "bind_where", "compile_where", "evaluate"]
