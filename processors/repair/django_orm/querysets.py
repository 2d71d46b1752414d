"""Which queryset call in the code issued a recorded statement, as Django renders it.

A recorded statement carries no code location finer than the function, and Django builds its text: the statement
is matched to a call by its shape. A SELECT's table names the model (:mod:`.models`), its form the terminal method
(``COUNT(*) AS "__count"`` → ``count()``, ``SELECT %s AS "a" ... LIMIT 1`` → ``exists()``, ``LIMIT 21`` →
``get()``, ``LIMIT 1`` → ``first()``/``last()``), and the columns its WHERE compares must be the ones the chain's
``filter``/``get`` keywords name. An UPDATE is an instance's ``save()`` (the instance read by a ``get``/``first``
of that model) or a queryset's ``update()``; an INSERT is ``objects.create(...)`` with the columns it sets. The calls
are searched in the recorded function and the module-level functions it calls (one level), through a local
variable that holds a queryset (``doctors = Doctor.objects.using(alias)``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import libcst as cst
from sqlglot import exp

from processors.repair.django_orm.models import Model, models_in, resolve
from processors.repair.source import SourceError, SourceIndex, walk
from processors.repair.sql_edit import RewriteError, parse
from processors.repair.strategies.base import NotApplicable, NotThisShape, Writer

_PASS: Final = frozenset({"all", "using", "select_related", "prefetch_related", "only", "defer", "order_by"})
_FILTERS: Final = frozenset({"filter", "get"})
_INSTANCES: Final = frozenset({"get", "first", "last", "create"})
MAX_GET_RESULTS: Final = 21  # Django's LIMIT on a get()


@dataclass(frozen=True, slots=True, eq=False)
class OrmCall:
    """A terminal queryset call (or an instance's ``save()``) and where it is."""

    path: Path
    func: cst.FunctionDef  # the def that holds the call
    call: cst.Call
    method: str
    model: Model
    filters: frozenset[str] | None  # the columns the chain's filter/get keywords compare (None: unreadable)


@dataclass(frozen=True, slots=True)
class Shape:
    """What a recorded statement is, for matching: operation, table, the terminal method it implies, columns."""

    operation: str  # select | update | insert | delete
    table: str
    methods: frozenset[str]
    columns: frozenset[str]  # WHERE columns (select, update, delete) or the columns set (insert)


def described(index: SourceIndex, oc: OrmCall) -> str:
    """``M.objects.get(pk=x)`` (line 12 of app.py): the call, for notes."""
    where = index.position(oc.path, oc.call)
    line = f" (line {where.start.line})" if where is not None else ""
    return f"`{cst.Module([]).code_for_node(oc.call)}`{line}"


def shape(statement: str) -> Shape:
    """The shape of a statement Django rendered (NotApplicable when it is not one of the forms above)."""
    try:
        tree = parse(statement)
    except RewriteError as exc:
        raise NotApplicable(str(exc)) from exc
    table = tree.find(exp.Table)
    if table is None:
        raise NotApplicable(f"no table in {statement!r}")
    where = tree.args.get("where")
    filtered = frozenset(c.name for c in where.find_all(exp.Column)) if isinstance(where, exp.Where) else frozenset()
    if isinstance(tree, exp.Select):
        limit = tree.args.get("limit")
        count = limit.expression if isinstance(limit, exp.Limit) else None
        rows = int(count.this) if isinstance(count, exp.Literal) and not count.is_string else None
        projection = tree.expressions
        if tree.find(exp.Count) is not None:
            methods = frozenset({"count"})
        elif rows == 1 and len(projection) == 1 and projection[0].alias == "a":
            methods = frozenset({"exists"})
        elif rows == MAX_GET_RESULTS:
            methods = frozenset({"get"})
        elif rows == 1:
            methods = frozenset({"first", "last"})
        else:
            raise NotApplicable(f"{statement!r} is not a get, first, exists or count")
        return Shape("select", table.name, methods, filtered)
    if isinstance(tree, exp.Update):
        return Shape("update", table.name, frozenset({"save", "update"}), filtered)
    if isinstance(tree, exp.Insert):
        schema = tree.this
        columns = frozenset(c.name for c in schema.expressions) if isinstance(schema, exp.Schema) else frozenset()
        return Shape("insert", table.name, frozenset({"create"}), columns)
    if isinstance(tree, exp.Delete):
        return Shape("delete", table.name, frozenset({"delete"}), filtered)
    raise NotApplicable(f"{statement!r}: not a SELECT, UPDATE, INSERT or DELETE")


def calls_of(index: SourceIndex, w: Writer, statement: str) -> list[OrmCall]:
    """The calls in the writer's code that issue ``statement`` (NotApplicable, with the reason, when none does)."""
    wanted = shape(statement)
    found: list[OrmCall] = []
    models: set[str] = set()
    for call in orm_calls(index, w):
        models.add(call.model.table)
        if call.model.table != wanted.table or call.method not in wanted.methods:
            continue
        if call.method in ("save", "create") or call.filters == wanted.columns:
            found.append(call)
    if not found:
        seen = f"models of {', '.join(sorted(models))}" if models else "no Django queryset"
        raise NotApplicable(f"no queryset call in {w.function} ({w.rel}) issues {statement!r} ({seen})")
    return found


def functions(index: SourceIndex, w: Writer) -> list[tuple[Path, cst.FunctionDef]]:
    """The recorded function and the module-level functions it calls (one level)."""
    try:
        func = index.function(w.path, w.function)
    except SourceError as exc:
        raise NotThisShape(str(exc)) from exc  # the raw-SQL shape says so
    if func is None:
        raise NotThisShape(f"function {w.function} not found in {w.rel}")
    out = [(w.path, func)]
    for node in walk(func.body):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name):
            found = index.local_def(w.path, node.func.value)
            if found is not None and all(found[1] is not f for _, f in out):
                out.append(found)
    return out


def orm_calls(index: SourceIndex, w: Writer) -> Iterator[OrmCall]:
    """Every terminal queryset call and instance ``save()`` in the writer's functions."""
    for path, func in functions(index, w):
        if not models_in(index, path) and not index.imports(path):
            continue
        for node in walk(func.body):
            if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
                continue
            method = node.func.attr.value
            receiver = node.func.value
            if method == "save" and isinstance(receiver, cst.Name):
                model = _instance_model(index, path, func, receiver.value)
                if model is not None:
                    yield OrmCall(path, func, node, method, model, None)
                continue
            chain = _chain(index, path, func, receiver)
            if chain is not None:
                model, filters = chain
                if method in _FILTERS:
                    filters = _with_keywords(model, filters, node)
                yield OrmCall(path, func, node, method, model, filters)


def locking_tables(index: SourceIndex, w: Writer) -> set[str]:
    """The tables the writer's functions read through ``select_for_update()``."""
    out: set[str] = set()
    for path, func in functions(index, w):
        for node in walk(func.body):
            attribute = node.func if isinstance(node, cst.Call) else None
            if isinstance(attribute, cst.Attribute) and attribute.attr.value == "select_for_update":
                chain = _chain(index, path, func, attribute.value)
                if chain is not None:
                    out.add(chain[0].table)
    return out


def assignments(func: cst.FunctionDef, name: str) -> list[cst.BaseExpression]:
    """The values assigned to ``name`` in ``func`` (``name = value``)."""
    out: list[cst.BaseExpression] = []
    for node in walk(func.body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name) and target.value == name:
                out.append(node.value)
    return out


def _instance_model(index: SourceIndex, path: Path, func: cst.FunctionDef, name: str) -> Model | None:
    """The model of an instance variable read by ``M.objects....get(...)`` (or first/last/create)."""
    values = assignments(func, name)
    if len(values) != 1:
        return None
    value = values[0]
    if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)):
        return None
    if value.func.attr.value not in _INSTANCES:
        return None
    chain = _chain(index, path, func, value.func.value)
    return chain[0] if chain is not None else None


def _chain(
    index: SourceIndex, path: Path, func: cst.FunctionDef, node: cst.BaseExpression, depth: int = 0
) -> tuple[Model, frozenset[str] | None] | None:
    """The model and filtered columns of a queryset expression (``M.objects.filter(...).using(...)``), or None."""
    if depth > 20:
        return None
    if isinstance(node, cst.Attribute) and node.attr.value == "objects" and isinstance(node.value, cst.Name):
        model = resolve(index, path, node.value.value)
        return (model, frozenset()) if model is not None else None
    if isinstance(node, cst.Name):
        values = assignments(func, node.value)
        return _chain(index, path, func, values[0], depth + 1) if len(values) == 1 else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        method = node.func.attr.value
        if method not in _PASS and method not in _FILTERS:
            return None
        inner = _chain(index, path, func, node.func.value, depth + 1)
        if inner is None:
            return None
        model, filters = inner
        return model, _with_keywords(model, filters, node) if method in _FILTERS else filters
    return None


def _with_keywords(model: Model, filters: frozenset[str] | None, call: cst.Call) -> frozenset[str] | None:
    """``filters`` plus the columns ``call``'s keywords compare (None when an argument is not such a keyword)."""
    if filters is None:
        return None
    columns = set(filters)
    for arg in call.args:
        if arg.keyword is None or arg.star:
            return None
        column = model.column(arg.keyword.value)
        if column is None:
            return None
        columns.add(column)
    return frozenset(columns)
