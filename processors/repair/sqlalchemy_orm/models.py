"""The SQLAlchemy models of a service's source: a table's mapped class (``__tablename__``) or Core ``Table(...)``.

A recorded statement names a table; the code names the class mapped to it (``Account``) or the variable holding its
``Table`` (``accounts``). :func:`model_for` finds it in the writer's module or a local module it imports from,
under the name the writer's module uses, with its primary-key columns (``primary_key=True``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from processors.repair.source import SourceError, SourceIndex, string_value


@dataclass(frozen=True, slots=True, eq=False)
class Model:
    """A table as the code names it: the mapped class (``node``) or a Core ``Table`` (``node`` None)."""

    name: str  # the name the writer's module uses for it
    table: str
    path: Path  # where it is defined
    node: cst.ClassDef | None
    primary_key: tuple[str, ...]

    @property
    def orm(self) -> bool:
        return self.node is not None


def model_for(index: SourceIndex, path: Path, table: str) -> Model | None:
    """The model of ``table`` seen from ``path`` (defined there, or imported from a local module)."""
    bare = table.rsplit(".", 1)[-1]
    found = _defined(index, path, bare)
    if found is not None:
        return found
    for local, (source, name) in index.imports(path).items():
        try:
            model = _defined(index, source, bare)
        except SourceError:
            continue
        if model is not None and model.name == name:
            return Model(local, model.table, model.path, model.node, model.primary_key)
    return None


def _defined(index: SourceIndex, path: Path, table: str) -> Model | None:
    for stmt in index.module(path).body:
        if isinstance(stmt, cst.ClassDef) and _tablename(stmt) == table:
            return Model(stmt.name.value, table, path, stmt, _class_keys(stmt))
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                core = _core_table(small, table)
                if core is not None:
                    return Model(core[0], table, path, None, core[1])
    return None


def tablename_statement(cls: cst.ClassDef) -> cst.SimpleStatementLine | None:
    """The ``__tablename__ = "..."`` line of a mapped class."""
    for stmt in cls.body.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if _assigned_name(small) == "__tablename__":
                    return stmt
    return None


def has_table_args(cls: cst.ClassDef) -> bool:
    return any(
        isinstance(stmt, cst.SimpleStatementLine) and any(_assigned_name(s) == "__table_args__" for s in stmt.body)
        for stmt in cls.body.body
    )


def _tablename(cls: cst.ClassDef) -> str | None:
    stmt = tablename_statement(cls)
    if stmt is None:
        return None
    small = stmt.body[0]
    value = small.value if isinstance(small, cst.Assign | cst.AnnAssign) else None
    return string_value(value) if value is not None else None


def _assigned_name(small: cst.BaseSmallStatement) -> str | None:
    target: cst.BaseExpression | None = None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
    elif isinstance(small, cst.AnnAssign):
        target = small.target
    return target.value if isinstance(target, cst.Name) else None


def _is_key(call: cst.Call) -> bool:
    return any(
        a.keyword is not None and a.keyword.value == "primary_key" and isinstance(a.value, cst.Name)
        and a.value.value == "True"
        for a in call.args
    )  # fmt: skip


def _class_keys(cls: cst.ClassDef) -> tuple[str, ...]:
    """The attributes declared ``mapped_column(..., primary_key=True)`` (or ``Column``)."""
    keys = []
    for stmt in cls.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            value = small.value if isinstance(small, cst.Assign | cst.AnnAssign) else None
            name = _assigned_name(small)
            if name is not None and isinstance(value, cst.Call) and _is_key(value):
                keys.append(name)
    return tuple(keys)


def _core_table(small: cst.BaseSmallStatement, table: str) -> tuple[str, tuple[str, ...]] | None:
    """``name = Table("table", metadata, Column("id", ..., primary_key=True), ...)`` → (name, keys)."""
    name = _assigned_name(small)
    value = small.value if isinstance(small, cst.Assign) else None
    if name is None or not isinstance(value, cst.Call) or not value.args:
        return None
    func = value.func
    callee = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    if callee != "Table" or string_value(value.args[0].value) != table:
        return None
    keys = []
    for arg in value.args[1:]:
        column = arg.value
        if isinstance(column, cst.Call) and column.args and _is_key(column):
            key = string_value(column.args[0].value)
            if key is not None:
                keys.append(key)
    return name, tuple(keys)
