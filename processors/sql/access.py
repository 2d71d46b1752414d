"""DB client span -> row ``Access`` events, by parsing the statement with sqlglot.

A statement's *shape* (table, operation, lock mode, which placeholder feeds which key, column or predicate)
is parameter-free, so it is computed once per statement text and kept in a bounded LRU; binding a span's
parameters into a cached shape is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import product
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from processors.model.events import Access, DbOperation, LockMode, Predicate, Scalar, entity_key, scope_key
from processors.model.span import Span
from processors.sql.batches import arity, batch_rows, runs
from processors.sql.control import transaction_control
from processors.sql.inserts import insert_rows
from processors.sql.keys import TableKeys
from processors.sql.predicate import Node, Refs, bind_where, compile_where
from processors.sql.syntax import (
    DIALECT,
    Const,
    Expr,
    Key,
    Named,
    Pos,
    Ref,
    Unbound,
    bind,
    comparison,
    conjuncts,
    flag,
    identity_entity_key,
    in_list,
    in_place,
    name_of,
    normalise_key_value,
    number_qmarks,
    psycopg_to_qmark,
    ref_of,
    table_of,
)
from processors.state.lru import CountedLRU
from processors.telemetry import Telemetry

# What sqlglot raises, beyond its parse and token errors, on text it was not written for (its internal bugs).
_SQLGLOT_INTERNAL = (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError)


@dataclass(frozen=True, slots=True)
class _Target:
    """One row a statement touches."""

    key: tuple[Key, ...]
    labels: tuple[str, ...]  # () → plain key; else identity columns (entity "t:col=v|...")
    set_values: tuple[tuple[str, Ref], ...]


Term = tuple[str, str, Ref | tuple[Ref, ...]]  # (column, operator, reference); IN's is a tuple of references


@dataclass(frozen=True, slots=True)
class _Shape:
    table: str
    schema: str
    operation: DbOperation
    lock: LockMode
    targets: tuple[_Target, ...]  # () for a predicate access
    predicates: tuple[Term, ...]
    keys_version: int = 0  # the table keys this shape was computed with
    keyed: bool = True
    exact: bool = True  # every WHERE term is in ``predicates``
    set_values: tuple[tuple[str, Ref], ...] = ()  # of a predicate access (UPDATE ... SET, INSERT VALUES)
    arity: int = 0  # positional parameters the statement takes (its highest $n): an executemany batch's row size
    rows: int = 1  # rows an unkeyed INSERT makes (set_values are the first's); 0: not known from the text (UNNEST)
    # Of a predicate access: its whole WHERE compiled (``processors.sql.predicate``), and why parts are undecidable
    where: tuple[Node, Refs] | None = None
    undecidable: tuple[str, ...] = ()


class SqlAccessExtractor:
    """Turns DB client spans into per-row ``Access`` events; counts what it skips and why."""

    def __init__(
        self,
        key_columns: Mapping[str, Sequence[str]] | None = None,
        version_columns: Sequence[str] = ("version",),
        insert_identity: Mapping[str, Sequence[str]] | None = None,
        cache_size: int = 4096,
        *,
        keys: TableKeys | None = None,
        max_tables: int = 10_000,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.telemetry = telemetry or Telemetry("sql")
        self.keys = keys or TableKeys(key_columns, max_tables=max_tables, telemetry=self.telemetry)
        self._version_columns = frozenset(version_columns)
        self._insert_identity = {k: tuple(v) for k, v in (insert_identity or {}).items()}
        self._cache: CountedLRU[str, _Shape | str] = CountedLRU(max(1, cache_size), self.telemetry, "statement_cache")
        # Predicate accesses per table (a table with no known key, or a statement that names no row by its key).
        self.unkeyed: CountedLRU[str, int] = CountedLRU(max(1, max_tables), self.telemetry, "max_tables")

    @property
    def counters(self) -> dict[str, int]:
        """What was skipped and why, and cache hits/misses (evictions are drops: ``telemetry.dropped``)."""
        return self.telemetry.events

    def _count(self, key: str) -> None:
        self.telemetry.count(key)

    @staticmethod
    def _config(cfg: Mapping[str, tuple[str, ...]], table: str, schema: str) -> tuple[str, ...]:
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
        if db.params and not db.named_params and (rows := batch_rows(db.params, shape.arity)) is not None:
            self._count("executemany_batches")  # one run of the statement per row of the batch
            return tuple(a for run in runs(span, rows) for a in self.accesses(run, function=function, file=file))
        named = {k.lstrip(":@$"): v for k, v in db.named_params} if db.named_params else {}
        params = db.params
        predicates, exact = self._bind_terms(shape.predicates, params, named)
        if not shape.keyed:
            self.unkeyed.put(shape.table, (self.unkeyed.peek(shape.table) or 0) + 1)
            self._count("predicate_accesses")
            sets, exprs = self._bind_sets(shape.set_values, params, named)
            where = None if shape.where is None else bind_where(*shape.where, params, named)
            for reason in shape.undecidable:
                self._count(f"predicate_undecidable_{reason}")  # evaluated, it is undecidable where this part decides
            if where is not None and any(not box for box in where[1]):
                self._count("predicate_undecidable_unbound_parameter")
            # exact: the WHERE is wholly known, as its terms or as a tree with every part evaluable and bound
            exact = (exact and shape.exact) or (where is not None and not shape.undecidable and all(where[1]))
            return (self._access(span, shape, scope_key(shape.table), predicates, sets, exprs, function, file,
                                 keyed=False, exact=exact, where=where),)  # fmt: skip
        result: list[Access] = []
        for target in shape.targets:
            values = [v for r in target.key if not isinstance(v := bind(r, params, named), Unbound)]
            if len(values) != len(target.key):
                self._count("unbound_key")
                continue
            if target.labels:
                entity = identity_entity_key(shape.table, target.labels, values)
            else:
                entity = entity_key(shape.table, tuple(normalise_key_value(v) for v in values))
            sets, exprs = self._bind_sets(target.set_values, params, named)
            result.append(self._access(span, shape, entity, predicates, sets, exprs, function, file))
        return tuple(result)

    @staticmethod
    def _bind_terms(terms: Sequence[Term], params: tuple[Scalar, ...],
                    named: Mapping[str, Scalar]) -> tuple[tuple[tuple[str, str, Any], ...], bool]:  # fmt: skip
        """The WHERE terms with the span's parameters bound; False when one could not be bound (dropped)."""
        out: list[tuple[str, str, Any]] = []
        exact = True
        for column, op, ref in terms:
            if isinstance(ref, tuple):
                values = [bind(r, params, named) for r in ref]
                if any(isinstance(v, Unbound) for v in values):
                    exact = False
                    continue
                out.append((column, op, tuple(values)))
            elif isinstance(v := bind(ref, params, named), Unbound) or isinstance(ref, Expr):
                exact = False  # an expression is SQL text, not a value a row image can be compared with
                if not isinstance(v, Unbound):
                    out.append((column, op, v))  # kept for the record (keyed accesses' guards)
            else:
                out.append((column, op, v))
        return tuple(out), exact

    @staticmethod
    def _bind_sets(sets: Sequence[tuple[str, Ref]], params: tuple[Scalar, ...],
                   named: Mapping[str, Scalar]) -> tuple[tuple[tuple[str, Scalar], ...], tuple[str, ...]]:  # fmt: skip
        values, exprs = [], []
        for column, ref in sets:
            v = bind(ref, params, named)
            if not isinstance(v, Unbound):
                values.append((column, v))
                if isinstance(ref, Expr):
                    exprs.append(column)
        return tuple(values), tuple(exprs)

    @staticmethod
    def _access(span: Span, shape: _Shape, entity: str, predicates: tuple[tuple[str, str, Any], ...],
                sets: tuple[tuple[str, Scalar], ...], exprs: tuple[str, ...], function: str, file: str, *,
                keyed: bool = True, exact: bool = True, where: Predicate | None = None) -> Access:  # fmt: skip
        db = span.db
        assert db is not None
        return Access(
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
            params=db.params,
            set_values=sets,
            predicates=predicates,
            read_version=db.row_version,
            tx_id=db.tx_id,
            error=span.is_error,
            function=function or span.code_function,
            file=file or span.code_file,
            idempotency_key=span.idempotency_key,
            links=span.links,
            set_exprs=exprs,
            keyed=keyed,
            exact=exact,
            where=where,
        )

    # -- per statement text (cached) -----------------------------------------------------------------
    def _shape(self, statement: str) -> _Shape | str:
        cached = self._cache.get(statement)
        if cached is not None and (isinstance(cached, str) or cached.keys_version == self.keys.version):
            self._count("cache_hits")
            return cached
        self._count("cache_misses")
        try:
            shape = self._analyse(statement)
        except RecursionError:  # pathologically nested SQL: sqlglot's generator recurses too
            shape = "too_deep"
        except _SQLGLOT_INTERNAL:  # sqlglot's tree or generator failing on odd input: unparseable, never raised
            shape = "analysis_error"
        self._cache.put(statement, shape)
        return shape

    def _parse(self, statement: str) -> exp.Expression | str:
        if transaction_control(statement) is not None:
            return "not_dml"  # BEGIN / COMMIT / SAVEPOINT ...: no row (and sqlglot reads SAVEPOINT as a bare command)
        sql = psycopg_to_qmark(statement)
        for dialect in (DIALECT, None):
            try:
                parsed = sqlglot.parse(number_qmarks(sql, dialect), dialect=dialect)
            except (ParseError, TokenError):
                continue
            except (*_SQLGLOT_INTERNAL, RecursionError):
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
        shape = self._analyse_tree(tree)
        return shape if isinstance(shape, str) else replace(shape, arity=arity(tree))

    def _analyse_tree(self, tree: exp.Expression) -> _Shape | str:
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
            inner = source.this if isinstance(source, exp.From) else None
            if isinstance(inner, exp.Subquery) and isinstance(inner.this, exp.Select) and not tree.args.get("where"):
                # ``SELECT count(*) FROM (SELECT * FROM t WHERE p FOR UPDATE) AS t``: the rows the inner query
                # selects (and locks) are what the statement reads (PostgreSQL refuses FOR UPDATE with aggregates).
                return self._analyse_tree(inner.this)
            names = table_of(inner)
            op = DbOperation.READ
        elif isinstance(tree, exp.Update):
            if tree.args.get("from_", tree.args.get("from")) or tree.args.get("joins"):
                return "multi_table"
            names, op = table_of(tree.this), DbOperation.WRITE
        elif isinstance(tree, exp.Delete):
            if tree.args.get("using") or tree.args.get("tables"):
                return "multi_table"
            names, op = table_of(tree.this), DbOperation.DELETE
        elif isinstance(tree, exp.SetOperation):
            return "set_operation"
        else:
            return "not_dml"
        if names is None:
            return "no_table"
        return self._where_shape(tree, names[0], names[1], op)

    def _where_shape(self, tree: exp.Expression, table: str, schema: str, op: DbOperation) -> _Shape | str:
        key_cols = self.keys.columns(table, schema)
        key_values: dict[str, list[Ref]] = {}
        terms: list[Term] = []  # every WHERE term, for a predicate access
        predicates: list[Term] = []  # the terms other than the key lookup
        exact = True
        for node in conjuncts(tree.args.get("where")):
            cmp = comparison(node) or flag(node)
            listed = in_list(node) if cmp is None else None
            if cmp is not None:
                terms.append(cmp)
                if cmp[1] == "=" and cmp[0] in key_cols and cmp[0] not in key_values:
                    key_values[cmp[0]] = [cmp[2]]
                else:
                    predicates.append(cmp)
            elif listed is not None:
                terms.append((listed[0], "IN", tuple(listed[1])))
                if listed[0] in key_cols and listed[0] not in key_values:
                    key_values[listed[0]] = listed[1]
            else:
                exact = False  # OR, a function, a subquery: the statement's rows are not known from its text
        sets: list[tuple[str, Ref]] = []
        lock = LockMode.NONE
        if isinstance(tree, exp.Select):
            locks = tree.args.get("locks") or []
            if locks:
                lock = LockMode.FOR_UPDATE if locks[0].args.get("update") else LockMode.FOR_SHARE
        elif isinstance(tree, exp.Update):
            guarded = {c for c, o, _ in terms if o not in ("IS", "IS NOT", "IN")}
            for assignment in tree.expressions:
                if isinstance(assignment, exp.EQ) and isinstance(assignment.this, exp.Column):
                    column = name_of(assignment.this.this)
                    sets.append((column, ref_of(assignment.expression)))
                    if lock is LockMode.NONE and column in guarded and in_place(column, assignment.expression):
                        lock = LockMode.ATOMIC
        if op is not DbOperation.READ and any(c in self._version_columns and o == "=" for c, o, _ in terms):
            lock = LockMode.OPTIMISTIC
        per_column: list[list[Key]] = []
        for column in key_cols:
            refs = key_values.get(column, [])
            keys = [r for r in refs if not isinstance(r, Expr)]
            if not refs or len(keys) != len(refs):
                per_column = []
                break
            per_column.append(keys)
        version = self.keys.version
        if not per_column:  # no key known, or the WHERE does not name rows by it: a predicate access
            compiled = compile_where(tree.args.get("where"))
            where, undecidable = (None, ()) if compiled is None else (compiled[:2], tuple(sorted(compiled[2])))
            return _Shape(table, schema, op, lock, (), tuple(terms), version, keyed=False, exact=exact,
                          set_values=tuple(sets), where=where, undecidable=undecidable)  # fmt: skip
        targets = tuple(_Target(combo, (), tuple(sets)) for combo in product(*per_column))
        return _Shape(table, schema, op, lock, targets, tuple(predicates), version)

    def _insert(self, tree: exp.Insert) -> _Shape | str:
        names = table_of(tree.this)
        if names is None:
            return "no_table"
        table, schema = names
        found = insert_rows(tree)
        if isinstance(found, str):
            return found  # INSERT ... SELECT from a table, DEFAULT VALUES, no column list
        columns = found.columns
        conflict = tree.args.get("conflict")
        conflict_cols: tuple[str, ...] = ()
        if isinstance(conflict, exp.OnConflict):
            keys = [k.this if isinstance(k, exp.Ordered) else k for k in conflict.args.get("conflict_keys") or []]
            keys = [k.this if isinstance(k, exp.Column) else k for k in keys]
            if all(isinstance(k, exp.Identifier) for k in keys):
                conflict_cols = tuple(name_of(k) for k in keys)
        candidates = (
            (self.keys.columns(table, schema), False),
            (self._config(self._insert_identity, table, schema), True),
            (conflict_cols, True),
        )
        lock = LockMode.UPSERT if conflict is not None else LockMode.NONE
        targets: list[_Target] = []
        for refs in () if found.arrays else found.rows:
            by_col = dict(zip(columns, refs, strict=True))
            for cols, labelled in candidates:
                key = [r for c in cols if isinstance(r := by_col.get(c), Const | Pos | Named)]
                if cols and len(key) == len(cols):
                    targets.append(_Target(tuple(key), cols if labelled else (), tuple(by_col.items())))
                    break
            else:
                break
        if targets and len(targets) == len(found.rows):
            return _Shape(table, schema, DbOperation.INSERT, lock, tuple(targets), (), self.keys.version)
        # The database assigns the key (or it is not known yet, or arrays feed the rows): a predicate access, its
        # values the first row's (``rows`` says how many the statement inserts; 0: not known from its text).
        return _Shape(table, schema, DbOperation.INSERT, lock, (), (), self.keys.version, keyed=False,
                      set_values=tuple(zip(columns, found.rows[0], strict=True)),
                      rows=0 if found.arrays else len(found.rows))  # fmt: skip
