"""DB client span -> row ``Access`` events, by parsing the statement with sqlglot.

A statement's *shape* (table, operation, lock mode, which placeholder feeds which key, column or predicate)
is parameter-free, so it is computed once per statement text and kept in a bounded LRU; binding a span's
parameters into a cached shape is cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from itertools import product
from types import MappingProxyType
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError, TokenError

from processors.api.telemetry import Telemetry
from processors.model.events import (
    Access,
    DbOperation,
    Keying,
    LockMode,
    Predicate,
    Scalar,
    entity_key,
)
from processors.model.span import Span
from processors.sql.batches import arity, batch_rows, runs
from processors.sql.binding import Term, bind_sets, bind_terms, columns_of
from processors.sql.control import transaction_control
from processors.sql.inserts import insert_rows
from processors.sql.keys import TableKeys
from processors.sql.made import RequestValues, SiteValues, Stamp, make_access
from processors.sql.predicate import compile_where
from processors.sql.shape import Shape, Target
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
from processors.sql.unkeyed import bind_scope, resets
from processors.state.lru import CountedLRU

_NO_NAMES: Mapping[str, Scalar] = MappingProxyType({})  # a span's named parameters when it has none
# (an enum's member read off its class is a Python-level lookup: those of every access's path, once, here)
_PREDICATE = Keying.PREDICATE
_INSERT = DbOperation.INSERT

# What sqlglot raises, beyond its parse and token errors, on text it was not written for (its internal bugs).
_SQLGLOT_INTERNAL = (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError)


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
        self._cache: CountedLRU[str, Shape | str] = CountedLRU(max(1, cache_size), self.telemetry, "statement_cache")
        # Predicate accesses per table (a table with no known key, or a statement that names no row by its key).
        self.unkeyed: CountedLRU[str, int] = CountedLRU(max(1, max_tables), self.telemetry, "max_tables")
        self.telemetry.declare("shared_cache_reset")
        self._resets = resets()  # the parameterless-binding cache's resets seen so far (``processors.sql.unkeyed``)

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
    def accesses(self, span: Span, *, function: str = "", file: str = "", site: SiteValues | None = None,
                 request: RequestValues | None = None) -> tuple[Access, ...]:  # fmt: skip
        """One ``Access`` per row the span's statement touches, or one predicate access on the table's scope when
        it names no row by its key (or by placeholders whose values the span does not carry); () only for a
        statement that is no row access (not DML, unparseable, ...), counted by reason as a drop. Its code site is
        ``site`` when given (else ``function`` / ``file`` or the span's own), its request ``request`` when given
        (else none yet, and the span's links): each access is made once, with every value."""
        db = span.db
        if db is None or not db.statement.strip():
            return self._skip("not_db")
        shape = self._shape(db.statement)
        if isinstance(shape, str):
            return self._skip(shape)
        if db.params and not db.named_params and (rows := batch_rows(db.params, shape.arity)) is not None:
            self._count("executemany_batches")  # one run of the statement per row of the batch
            made = [
                self.accesses(r, function=function, file=file, site=site, request=request) for r in runs(span, rows)
            ]
            return tuple(a for each in made for a in each)
        stamp = (site or (function or span.code_function, file or span.code_file, 0, "", ()),
                 request or ("", 0, 0, False, "", 0, span.links, None))  # fmt: skip
        named = {k.lstrip(":@$"): v for k, v in db.named_params} if db.named_params else _NO_NAMES
        params = db.params
        if not shape.keyed:
            predicates, exact, sets, exprs, where, unbound = bind_scope(shape, params, named)
            if (now := resets()) != self._resets:  # the shared parameterless bindings started again (bounded)
                self.telemetry.drop("shared_cache_reset", now - self._resets)
                self._resets = now
            for reason in shape.undecidable:
                self._count(f"predicate_undecidable_{reason}")  # evaluated, it is undecidable where this part decides
            if where is not None and () in where[1]:  # a placeholder's box is empty
                self._count("predicate_undecidable_unbound_parameter")
            return (self._predicate(span, shape, predicates, exact, sets, exprs, stamp, unbound=unbound, where=where),)
        result: list[Access] = []
        for target in shape.targets:
            values = [v for r in target.key if not isinstance(v := bind(r, params, named), Unbound)]
            if len(values) != len(target.key):
                return self._unbound(span, shape, params, named, stamp)
            if target.labels:
                entity = identity_entity_key(shape.table, target.labels, values)
            else:
                entity = entity_key(shape.table, tuple(normalise_key_value(v) for v in values))
            predicates = self._bind_terms(shape.predicates, params, named)[0]
            sets, exprs = self._bind_sets(target.set_values, params, named)
            result.append(self._access(span, shape, entity, predicates, sets, exprs, stamp, filters=shape.filters,
                                       set_columns=columns_of(target.set_values)))  # fmt: skip
        return tuple(result)

    def _skip(self, reason: str) -> tuple[Access, ...]:
        """A statement that yields no access: counted by reason, as an event and as a drop."""
        self._count(reason)
        self.telemetry.drop(reason)
        return ()

    def _predicate(self, span: Span, shape: Shape, predicates: tuple[tuple[str, str, Any], ...], exact: bool,
                   sets: tuple[tuple[str, Scalar], ...], exprs: tuple[str, ...], stamp: Stamp, *,
                   unbound: tuple[tuple[str, str], ...] = (), unbound_key: bool = False,
                   where: Predicate | None = None) -> Access:  # fmt: skip
        """The statement as a predicate access on its table's scope (counted per table)."""
        unkeyed = self.unkeyed
        unkeyed.put(shape.table, (unkeyed.peek(shape.table) or 0) + 1)
        self.telemetry.count("predicate_accesses")
        return self._access(span, shape, shape.scope, predicates, sets, exprs, stamp,
                            keyed=False, exact=exact, filters=shape.filters, set_columns=shape.set_columns,
                            unbound=unbound, unbound_key=unbound_key, keying=_PREDICATE,
                            where=where)  # fmt: skip

    def _key_terms(self, shape: Shape) -> tuple[Term, ...]:
        """The WHERE terms that name a keyed shape's rows: ``column = ref``, or ``column IN (refs)``."""
        target = shape.targets[0]
        columns = target.labels or self.keys.columns(shape.table, shape.schema)
        if len(columns) != len(target.key):
            return ()
        terms: list[Term] = []
        for i, column in enumerate(columns):
            refs = tuple(dict.fromkeys(t.key[i] for t in shape.targets))
            terms.append((column, "=", refs[0]) if len(refs) == 1 else (column, "IN", refs))
        return tuple(terms)

    def _filters(self, shape: Shape) -> tuple[str, ...]:
        """The columns a statement's WHERE compares, whether or not the span carries their values (``Shape.filters``:
        its key columns are those of the table keys it was read with)."""
        key = () if not shape.keyed or shape.operation is DbOperation.INSERT else self._key_terms(shape)
        return tuple(dict.fromkeys(c for c, _, _ in (*key, *shape.predicates)))

    def _unbound(self, span: Span, shape: Shape, params: tuple[Scalar, ...], named: Mapping[str, Scalar],
                 stamp: Stamp) -> tuple[Access, ...]:  # fmt: skip
        """A keyed statement whose key values are not on the span (stock instrumentation records no parameters):
        still an access, of the table's scope, carrying its shape (operation, lock mode, the columns it filters on
        and sets, the key columns it names a row by); stage 2 keys it by the row change it made (a write) or by
        what the same trace's later statements prove (a read). One access per statement (a multi-row INSERT's
        rows are one access: counted)."""
        self._count("unbound_key")
        if len(shape.targets) > 1:
            self._count("unbound_key_rows_merged")
        target = shape.targets[0]
        terms = () if shape.operation is _INSERT else (*self._key_terms(shape), *shape.predicates)
        predicates, _, unbound = self._bind_terms(terms, params, named)
        sets, exprs = self._bind_sets(target.set_values, params, named)
        return (self._predicate(span, shape, predicates, False, sets, exprs, stamp, unbound=unbound,
                                unbound_key=True),)  # fmt: skip

    _bind_terms = staticmethod(bind_terms)
    _bind_sets = staticmethod(bind_sets)

    _access = staticmethod(make_access)

    # -- per statement text (cached) -----------------------------------------------------------------
    def shape(self, statement: str) -> Shape | str:
        """The statement's parameter-free reading, or why there is none (cached; see ``processors.sql.shape``)."""
        return self._shape(statement)

    def _shape(self, statement: str) -> Shape | str:
        cached = self._cache.get(statement)
        if cached is not None and (isinstance(cached, str) or cached.keys_version == self.keys.version):
            self.telemetry.count("cache_hits")
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

    def _analyse(self, statement: str) -> Shape | str:
        tree = self._parse(statement)
        if isinstance(tree, str):
            return tree
        shape = self._analyse_tree(tree)
        if isinstance(shape, str):
            return shape
        sets = shape.set_values or (shape.targets[0].set_values if shape.targets else ())  # a predicate access's
        return replace(shape, arity=arity(tree), filters=self._filters(shape), set_columns=columns_of(sets))

    def _analyse_tree(self, tree: exp.Expression) -> Shape | str:
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

    def _where_shape(self, tree: exp.Expression, table: str, schema: str, op: DbOperation) -> Shape | str:
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
            return Shape(table, schema, op, lock, (), tuple(terms), version, keyed=False, exact=exact,
                          set_values=tuple(sets), where=where, undecidable=undecidable)  # fmt: skip
        targets = tuple(Target(combo, (), tuple(sets)) for combo in product(*per_column))
        return Shape(table, schema, op, lock, targets, tuple(predicates), version)

    def _insert(self, tree: exp.Insert) -> Shape | str:
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
        targets: list[Target] = []
        for refs in () if found.arrays else found.rows:
            by_col = dict(zip(columns, refs, strict=True))
            for cols, labelled in candidates:
                key = [r for c in cols if isinstance(r := by_col.get(c), Const | Pos | Named)]
                if cols and len(key) == len(cols):
                    targets.append(Target(tuple(key), cols if labelled else (), tuple(by_col.items())))
                    break
            else:
                break
        if targets and len(targets) == len(found.rows):
            return Shape(table, schema, DbOperation.INSERT, lock, tuple(targets), (), self.keys.version)
        # The database assigns the key (or it is not known yet, or arrays feed the rows): a predicate access, its
        # values the first row's (``rows`` says how many the statement inserts; 0: not known from its text).
        return Shape(table, schema, DbOperation.INSERT, lock, (), (), self.keys.version, keyed=False,
                      set_values=tuple(zip(columns, found.rows[0], strict=True)),
                      rows=0 if found.arrays else len(found.rows))  # fmt: skip
