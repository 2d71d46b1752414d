"""DB client span → row ``Access`` events, by parsing the statement with sqlglot.

A statement's *shape* (table, operation, lock mode, which placeholder feeds which key, column or predicate)
is parameter-free, so it is computed once per statement text and kept in a bounded LRU; binding a span's
parameters into a cached shape is cheap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import product
from typing import Any, Final

import sqlglot
from sqlglot import TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, SqlglotError, TokenError

from streamer.events import Access, DbOperation, LockMode, Scalar, Span, entity_key

_DIALECT: Final = "postgres"
_OPS: Final[dict[type[exp.Expression], str]] = {
    exp.EQ: "=",
    exp.NEQ: "<>",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
_FLIP: Final = {"=": "=", "<>": "<>", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


@dataclass(frozen=True, slots=True)
class _Const:
    value: Scalar


@dataclass(frozen=True, slots=True)
class _Pos:
    index: int  # 0-based index into DbCall.params


@dataclass(frozen=True, slots=True)
class _Named:
    name: str


@dataclass(frozen=True, slots=True)
class _Expr:
    """SQL text with bindable holes: parts[0] refs[0] parts[1] ... parts[-1]."""

    parts: tuple[str, ...]
    refs: tuple[_Pos | _Named, ...]
    fallback: tuple[str, ...]  # placeholder text to print when a ref is unbound


_Ref = _Const | _Pos | _Named | _Expr
_Key = _Const | _Pos | _Named


@dataclass(frozen=True, slots=True)
class _Target:
    """One row a statement touches."""

    key: tuple[_Key, ...]
    labels: tuple[str, ...]  # () → plain key; else identity columns (entity "t:col=v|...")
    set_values: tuple[tuple[str, _Ref], ...]


@dataclass(frozen=True, slots=True)
class _Shape:
    table: str
    schema: str
    operation: DbOperation
    lock: LockMode
    targets: tuple[_Target, ...]
    predicates: tuple[tuple[str, str, _Ref], ...]


class _Unbound:
    """A placeholder with no parameter value on the span."""


_UNBOUND: Final = _Unbound()


def normalise_key_value(value: Any) -> Scalar:
    """Key values as both spans and Debezium give them: integral floats/Decimals → int."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    return str(value)


def identity_entity_key(table: str, columns: Sequence[str], values: Sequence[Any]) -> str:
    """Entity key of an insert keyed by its natural identity, e.g. ``charges:order_id=42``."""
    rendered = []
    for column, value in zip(columns, values, strict=True):
        v = normalise_key_value(value)
        rendered.append(f"{column}={'' if v is None else v}")
    return entity_key(table, tuple(rendered))


def _psycopg_to_qmark(sql: str) -> str:
    """psycopg ``%s`` → ``?``, ``%(name)s`` → ``:name``, ``%%`` → ``%`` (psycopg ignores quoting too)."""
    if "%s" not in sql and "%(" not in sql:
        return sql
    out: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "%" and i + 1 < n:
            nxt = sql[i + 1]
            if nxt == "%":
                out.append("%")
                i += 2
                continue
            if nxt in "sbt":
                out.append("?")
                i += 2
                continue
            if nxt == "(":
                close = sql.find(")", i + 2)
                name = sql[i + 2 : close] if close > 0 else ""
                if name.isidentifier() and close + 1 < n and sql[close + 1] in "sbt":
                    out.append(":" + name)
                    i = close + 2
                    continue
        out.append(c)
        i += 1
    return "".join(out)


def _number_qmarks(sql: str, dialect: str | None) -> str:
    """``?`` → ``$1, $2, ...`` in order of appearance (tokenizer-aware: not inside strings or comments)."""
    if "?" not in sql:
        return sql
    tokens = Dialect.get_or_raise(dialect).tokenize(sql)
    if any(t.token_type == TokenType.PARAMETER for t in tokens):
        return sql  # already $n style; a `?` here is an operator
    pieces: list[str] = []
    last = k = 0
    for t in tokens:
        if (t.token_type == TokenType.PLACEHOLDER and t.text == "?") or t.text == "?::":  # `?::int` cast
            k += 1
            pieces += (sql[last : t.start], f"${k}")
            last = t.start + 1
    return "".join(pieces) + sql[last:]


def _name(node: exp.Expression | None) -> str:
    if not isinstance(node, exp.Identifier):
        return "" if node is None else node.name
    return node.name if node.quoted else node.name.lower()


def _placeholder(node: exp.Expression) -> _Pos | _Named | None:
    if isinstance(node, exp.Parameter):
        inner = node.this
        if isinstance(inner, exp.Literal) and inner.name.isdigit() and int(inner.name) > 0:
            return _Pos(int(inner.name) - 1)
        return _Named(inner.name) if isinstance(inner, exp.Expression) else None
    if isinstance(node, exp.Placeholder) and node.name and node.name != "?":
        return _Named(node.name)
    if isinstance(node, exp.Column) and not node.table and node.name[1:].isdigit() and node.name[0] == "$":
        return _Pos(int(node.name[1:]) - 1)  # `$1` as the default dialect reads it
    return None


def _literal(node: exp.Expression) -> _Const | None:
    if isinstance(node, exp.Literal):
        if node.is_string:
            return _Const(node.name)
        text = node.name
        for convert in (int, float):
            try:
                return _Const(convert(text))
            except ValueError:
                pass
        return _Const(text)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        inner = _literal(node.this)
        if inner is not None and isinstance(inner.value, int | float) and not isinstance(inner.value, bool):
            return _Const(-inner.value)
    if isinstance(node, exp.Boolean):
        return _Const(bool(node.this))
    if isinstance(node, exp.Null):
        return _Const(None)
    return None


def _template(node: exp.Expression) -> _Expr:
    refs: list[_Pos | _Named] = []
    texts: list[str] = []

    def hole(n: exp.Expression) -> exp.Expression:
        ref = _placeholder(n)
        if ref is None:
            return n
        refs.append(ref)
        texts.append(n.sql(dialect=_DIALECT))
        return exp.Var(this=f"__trp{len(refs) - 1}__")

    text = node.transform(hole).sql(dialect=_DIALECT)
    found = sorted((text.find(f"__trp{i}__"), i) for i in range(len(refs)))
    if any(pos < 0 for pos, _ in found):
        return _Expr((node.sql(dialect=_DIALECT),), (), ())
    parts, order, last = [], [], 0
    for pos, i in found:
        parts.append(text[last:pos])
        order.append(i)
        last = pos + len(f"__trp{i}__")
    parts.append(text[last:])
    return _Expr(tuple(parts), tuple(refs[i] for i in order), tuple(texts[i] for i in order))


def _ref(node: exp.Expression) -> _Ref:
    while isinstance(node, exp.Cast | exp.Paren) and isinstance(node.this, exp.Expression):
        node = node.this
    return _placeholder(node) or _literal(node) or _template(node)


def conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    """The AND-ed terms of a WHERE clause, in text order (iterative: long AND chains are deep trees)."""
    out: list[exp.Expression] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, exp.Where | exp.Paren):
            stack.append(n.this)
        elif isinstance(n, exp.And):
            stack += (n.expression, n.this)
        elif isinstance(n, exp.Expression):
            out.append(n)
    return out


def _comparison(node: exp.Expression) -> tuple[str, str, _Ref] | None:
    """``col op value`` (either side), ``col IS [NOT] NULL``; None for anything else."""
    negate = False
    if isinstance(node, exp.Not) and isinstance(node.this, exp.Is):
        node, negate = node.this, True
    if isinstance(node, exp.Is) and isinstance(node.this, exp.Column):
        negate ^= bool(node.args.get("negate"))
        return _name(node.this.this), "IS NOT" if negate else "IS", _ref(node.expression)
    op = _OPS.get(type(node))
    if op is None:
        return None
    left, right = node.this, node.expression
    if isinstance(left, exp.Column):
        return _name(left.this), op, _ref(right)
    if isinstance(right, exp.Column):
        return _name(right.this), _FLIP[op], _ref(left)
    return None


def _in_list(node: exp.Expression) -> tuple[str, list[_Ref]] | None:
    if isinstance(node, exp.In) and isinstance(node.this, exp.Column) and not node.args.get("query"):
        return _name(node.this.this), [_ref(e) for e in node.expressions]
    return None


def _table(node: exp.Expression | None) -> tuple[str, str] | None:
    if isinstance(node, exp.Schema):
        node = node.this
    if not isinstance(node, exp.Table) or not isinstance(node.this, exp.Identifier):
        return None
    return _name(node.this), _name(node.args.get("db"))


class SqlAccessExtractor:
    """Turns DB client spans into per-row ``Access`` events; counts what it skips and why."""

    def __init__(
        self,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        version_columns: Sequence[str] = ("version",),
        insert_identity: Mapping[str, Sequence[str]] | None = None,
        cache_size: int = 4096,
    ) -> None:
        self._key_columns = {k: tuple(v) for k, v in (key_columns or {}).items()}
        self._version_columns = frozenset(version_columns)
        self._insert_identity = {k: tuple(v) for k, v in (insert_identity or {}).items()}
        self._cache: OrderedDict[str, _Shape | str] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self.counters: dict[str, int] = {}

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def _config(self, cfg: Mapping[str, tuple[str, ...]], table: str, schema: str) -> tuple[str, ...]:
        return cfg.get(f"{schema}.{table}") or cfg.get(table) or ()

    # -- per span ------------------------------------------------------------------------------------
    def accesses(self, span: Span, *, function: str = "", file: str = "") -> tuple[Access, ...]:
        """One ``Access`` per row the span's statement touches; () (counted by reason) when there is none."""
        db = span.db
        if db is None or not db.statement.strip():
            self._count("not_db")
            return ()
        shape = self._shape(db.statement)
        if isinstance(shape, str):
            self._count(shape)
            return ()
        named = {k.lstrip(":@$"): v for k, v in db.named_params} if db.named_params else {}
        params = db.params
        predicates = tuple(
            (c, op, v) for c, op, r in shape.predicates if not isinstance(v := _bind(r, params, named), _Unbound)
        )
        result: list[Access] = []
        for target in shape.targets:
            values = [v for r in target.key if not isinstance(v := _bind(r, params, named), _Unbound)]
            if len(values) != len(target.key):
                self._count("unbound_key")
                continue
            if target.labels:
                entity = identity_entity_key(shape.table, target.labels, values)
            else:
                entity = entity_key(shape.table, tuple(normalise_key_value(v) for v in values))
            set_values, set_exprs = [], []
            for column, ref in target.set_values:
                v = _bind(ref, params, named)
                if not isinstance(v, _Unbound):
                    set_values.append((column, v))
                    if isinstance(ref, _Expr):
                        set_exprs.append(column)
            result.append(
                Access(
                    entity=entity,
                    table=shape.table,
                    operation=shape.operation,
                    lock=shape.lock,
                    trace_id=span.trace_id,
                    span_id=span.span_id,
                    service=span.resource.service,
                    version=span.resource.version,
                    start_ns=span.start_ns,
                    end_ns=span.end_ns,
                    statement=db.statement,
                    params=params,
                    set_values=tuple(set_values),
                    predicates=predicates,
                    read_version=db.row_version,
                    tx_id=db.tx_id,
                    error=span.is_error,
                    function=function or span.code_function,
                    file=file or span.code_file,
                    idempotency_key=span.idempotency_key,
                    links=span.links,
                    set_exprs=tuple(set_exprs),
                )
            )
        return tuple(result)

    # -- per statement text (cached) -----------------------------------------------------------------
    def _shape(self, statement: str) -> _Shape | str:
        cached = self._cache.get(statement)
        if cached is not None:
            self._cache.move_to_end(statement)
            self._count("cache_hits")
            return cached
        self._count("cache_misses")
        try:
            shape = self._analyse(statement)
        except RecursionError:  # pathologically nested SQL: sqlglot's generator recurses too
            shape = "too_deep"
        self._cache[statement] = shape
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
            self._count("cache_evictions")
        return shape

    def _parse(self, statement: str) -> exp.Expression | str:
        sql = _psycopg_to_qmark(statement)
        for dialect in (_DIALECT, None):
            try:
                parsed = sqlglot.parse(_number_qmarks(sql, dialect), dialect=dialect)
            except (ParseError, TokenError):
                continue
            except (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
                self._count("parser_internal_error")  # sqlglot bug on odd input: skip, never raise
                continue
            trees = [t for t in parsed if isinstance(t, exp.Expression)]
            if dialect is None:
                self._count("parse_fallback")
            if not trees:
                return "empty"
            return trees[0] if len(trees) == 1 else "multi_statement"
        return "unparseable"

    def _analyse(self, statement: str) -> _Shape | str:
        tree = self._parse(statement)
        if isinstance(tree, str):
            return tree
        if isinstance(tree, exp.Select | exp.Update | exp.Delete | exp.Insert) and tree.args.get(
            "with_", tree.args.get("with")
        ):
            return "cte"
        if isinstance(tree, exp.Insert):
            return self._insert(tree)
        if isinstance(tree, exp.Select):
            source = tree.args.get("from_", tree.args.get("from"))
            if tree.args.get("joins"):
                return "multi_table"
            names = _table(source.this if isinstance(source, exp.From) else None)
            op = DbOperation.READ
        elif isinstance(tree, exp.Update):
            if tree.args.get("from_", tree.args.get("from")) or tree.args.get("joins"):
                return "multi_table"
            names, op = _table(tree.this), DbOperation.WRITE
        elif isinstance(tree, exp.Delete):
            if tree.args.get("using") or tree.args.get("tables"):
                return "multi_table"
            names, op = _table(tree.this), DbOperation.DELETE
        elif isinstance(tree, exp.SetOperation):
            return "set_operation"
        else:
            return "not_dml"
        if names is None:
            return "no_table"
        return self._where_shape(tree, names[0], names[1], op)

    def _where_shape(self, tree: exp.Expression, table: str, schema: str, op: DbOperation) -> _Shape | str:
        key_cols = self._config(self._key_columns, table, schema) or ("id",)
        key_values: dict[str, list[_Ref]] = {}
        predicates: list[tuple[str, str, _Ref]] = []
        for node in conjuncts(tree.args.get("where")):
            cmp = _comparison(node)
            in_list = _in_list(node) if cmp is None else None
            if cmp is not None and cmp[1] == "=" and cmp[0] in key_cols and cmp[0] not in key_values:
                key_values[cmp[0]] = [cmp[2]]
            elif in_list is not None and in_list[0] in key_cols and in_list[0] not in key_values:
                key_values[in_list[0]] = in_list[1]
            elif cmp is not None:
                predicates.append(cmp)
        per_column: list[list[_Key]] = []
        for column in key_cols:
            refs = key_values.get(column, [])
            keys = [r for r in refs if not isinstance(r, _Expr)]
            if not refs or len(keys) != len(refs):
                return "unkeyed"
            per_column.append(keys)
        sets: list[tuple[str, _Ref]] = []
        lock = LockMode.NONE
        if isinstance(tree, exp.Select):
            locks = tree.args.get("locks") or []
            if locks:
                lock = LockMode.FOR_UPDATE if locks[0].args.get("update") else LockMode.FOR_SHARE
        elif isinstance(tree, exp.Update):
            guarded = {c for c, o, _ in predicates if o not in ("IS", "IS NOT")}
            for assignment in tree.expressions:
                if isinstance(assignment, exp.EQ) and isinstance(assignment.this, exp.Column):
                    column = _name(assignment.this.this)
                    sets.append((column, _ref(assignment.expression)))
                    if lock is LockMode.NONE and column in guarded and _in_place(column, assignment.expression):
                        lock = LockMode.ATOMIC
        if op is not DbOperation.READ and any(c in self._version_columns and o == "=" for c, o, _ in predicates):
            lock = LockMode.OPTIMISTIC
        targets = tuple(_Target(combo, (), tuple(sets)) for combo in product(*per_column))
        return _Shape(table, schema, op, lock, targets, tuple(predicates))

    def _insert(self, tree: exp.Insert) -> _Shape | str:
        names = _table(tree.this)
        if names is None:
            return "no_table"
        table, schema = names
        if not isinstance(tree.this, exp.Schema) or not isinstance(tree.expression, exp.Values):
            return "insert_no_values"  # INSERT ... SELECT, DEFAULT VALUES, no column list
        columns = [_name(c) for c in tree.this.expressions]
        conflict = tree.args.get("conflict")
        conflict_cols: tuple[str, ...] = ()
        if isinstance(conflict, exp.OnConflict):
            keys = [k.this if isinstance(k, exp.Ordered) else k for k in conflict.args.get("conflict_keys") or []]
            keys = [k.this if isinstance(k, exp.Column) else k for k in keys]
            if all(isinstance(k, exp.Identifier) for k in keys):
                conflict_cols = tuple(_name(k) for k in keys)
        candidates = (
            (self._config(self._key_columns, table, schema) or ("id",), False),
            (self._config(self._insert_identity, table, schema), True),
            (conflict_cols, True),
        )
        targets: list[_Target] = []
        for row in tree.expression.expressions:
            refs = [_ref(v) for v in row.expressions] if isinstance(row, exp.Tuple) else [_ref(row)]
            if len(refs) != len(columns):
                return "insert_arity"
            by_col = dict(zip(columns, refs, strict=True))
            for cols, labelled in candidates:
                key = [r for c in cols if isinstance(r := by_col.get(c), _Const | _Pos | _Named)]
                if cols and len(key) == len(cols):
                    targets.append(_Target(tuple(key), cols if labelled else (), tuple(by_col.items())))
                    break
            else:
                return "unkeyed"
        lock = LockMode.UPSERT if conflict is not None else LockMode.NONE
        return _Shape(table, schema, DbOperation.INSERT, lock, tuple(targets), ())


def _in_place(column: str, value: exp.Expression) -> bool:
    """``col ± expr`` (either operand order for ``+``)."""
    if isinstance(value, exp.Paren):
        value = value.this
    if isinstance(value, exp.Sub):
        operands = [value.this]
    elif isinstance(value, exp.Add):
        operands = [value.this, value.expression]
    else:
        return False
    return any(isinstance(o, exp.Column) and _name(o.this) == column for o in operands)


def _bind(ref: _Ref, params: tuple[Scalar, ...], named: Mapping[str, Scalar]) -> Scalar | _Unbound:
    if isinstance(ref, _Const):
        return ref.value
    if isinstance(ref, _Pos):
        return params[ref.index] if ref.index < len(params) else _UNBOUND
    if isinstance(ref, _Named):
        return named.get(ref.name, _UNBOUND)
    out = [ref.parts[0]]
    for hole, text, part in zip(ref.refs, ref.fallback, ref.parts[1:], strict=True):
        v = _bind(hole, params, named)
        out += (text if isinstance(v, _Unbound) else _sql_literal(v), part)
    return "".join(out)


def _sql_literal(value: Scalar) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return str(value)
    return "'" + value.replace("'", "''") + "'"
