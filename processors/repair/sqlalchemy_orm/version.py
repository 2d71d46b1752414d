"""Optimistic versioning in SQLAlchemy code: the mapped class counts its row's versions (``version_id_col``), so
an UPDATE of a row another transaction changed since it was read matches nothing and the flush fails.

The class gets the column (``version: Mapped[int] = mapped_column(Integer, nullable=False)``, the name from the
planning's ``version_columns``) and ``__mapper_args__ = {"version_id_col": version}``; the plan carries the
migration (``ALTER TABLE ... ADD COLUMN version integer NOT NULL DEFAULT 1``). SQLAlchemy then writes
``UPDATE ... SET ..., version = <read + 1> WHERE <pk> = ... AND version = <read>`` and raises
``sqlalchemy.orm.exc.StaleDataError`` at the flush when no row matched: the later of two concurrent writers fails
instead of overwriting the other's change (the note says so; the code decides whether to answer a conflict or run
the request again). The SQL-level form is the recorded UPDATE with ``AND version = %s`` when its placeholders are
positional; SQLAlchemy's named ones get none (the version is bound by SQLAlchemy, not by the code).
"""

from __future__ import annotations

import libcst as cst

from processors.repair import sql_rewrite
from processors.repair.classify import table_of
from processors.repair.migration_files import alembic
from processors.repair.patch import Patch
from processors.repair.sql_edit import RewriteError, identifier
from processors.repair.sqlalchemy_orm.calls import ensure_import, names, scope_of
from processors.repair.sqlalchemy_orm.models import Model, model_for
from processors.repair.strategies.base import (
    OPTIMISTIC_VERSION,
    Context,
    NotApplicable,
    NotThisShape,
    Op,
    Outcome,
    Writer,
)


def optimistic_version(ctx: Context, w: Writer) -> Outcome:
    """A version counter on the written rows' mapped class: a stale write fails at its flush."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates or not w.reads:
        raise NotApplicable("no UPDATE after a read to version")
    scope = scope_of(ctx.index, w)
    column = ctx.version_columns[0]
    if not column.isidentifier():
        raise NotApplicable(f"version column {column!r} is not a Python name")
    out = Outcome()
    for update in updates:
        table = table_of(update.statement)
        model = model_for(ctx.index, w.path, table) if table else None
        if model is None or model.node is None:
            raise NotThisShape(f"no mapped class for {table or update.statement!r} in {w.rel}")
        if not any(names(fn, model.name) for fn in scope.defs):
            raise NotApplicable(f"{scope.function.name.value} does not use {model.name}")
        last = _last_column(model.node)
        if last is None or _declares(model.node, column) or _declares(model.node, "__mapper_args__"):
            raise NotApplicable(f"{model.name} already declares {column} or __mapper_args__ (or no column)")
        out.ops.append(_version_op(ctx, model, last, column))
        migration = f"ALTER TABLE {identifier(table).sql('postgres')} ADD COLUMN {column} integer NOT NULL DEFAULT 1"
        if migration not in out.migrations:
            out.migrations.append(migration)
        try:
            edit = sql_rewrite.optimistic(update.statement, column)
        except RewriteError as exc:
            out.notes.append(f"{w.function}: {OPTIMISTIC_VERSION}: no SQL-level form ({exc})")
            out.repairs.append(ctx.info(OPTIMISTIC_VERSION, w, update.statement, update.statement))
        else:
            out.repairs.append(ctx.info(OPTIMISTIC_VERSION, w, update.statement, edit.after))
            out.rewrote(edit)
        how = alembic.add_revision(out, model.path, ctx.index.root, migration, f"trace-repro: {table}.{column}",
                                   alembic.version_column(table, column))  # fmt: skip
        out.notes.append(f"{w.function}: {OPTIMISTIC_VERSION}: {model.name} gets a {column} column and "
                         f"version_id_col; a concurrent change makes the flush raise StaleDataError (answer a "
                         f"conflict or run the request again); needs the migration {migration} ({how})")  # fmt: skip
    return out


def _statements(cls: cst.ClassDef) -> list[cst.SimpleStatementLine]:
    return [s for s in cls.body.body if isinstance(s, cst.SimpleStatementLine)]


def _target(stmt: cst.SimpleStatementLine) -> str | None:
    small = stmt.body[0]
    target = small.target if isinstance(small, cst.AnnAssign) else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        target = small.targets[0].target
    return target.value if isinstance(target, cst.Name) else None


def _declares(cls: cst.ClassDef, name: str) -> bool:
    return any(_target(s) == name for s in _statements(cls))


def _last_column(cls: cst.ClassDef) -> cst.SimpleStatementLine | None:
    """The class's last ``x: Mapped[...] = mapped_column(...)`` line (the new column goes after it)."""
    found = None
    for stmt in _statements(cls):
        small = stmt.body[0]
        value = small.value if isinstance(small, cst.AnnAssign) else None
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "mapped_column":
            found = stmt
    return found


def _version_op(ctx: Context, model: Model, last: cst.SimpleStatementLine, column: str) -> Op:
    def op(patch: Patch) -> None:
        mapped = ensure_import(patch, ctx.index, model.path, "sqlalchemy.orm", "Mapped")
        mapped_column = ensure_import(patch, ctx.index, model.path, "sqlalchemy.orm", "mapped_column")
        integer = ensure_import(patch, ctx.index, model.path, "sqlalchemy", "Integer")
        declared = cst.parse_statement(f"{column}: {mapped}[int] = {mapped_column}({integer}, nullable=False)\n")
        args = cst.parse_statement(f'__mapper_args__ = {{"version_id_col": {column}}}  # optimistic versioning\n')
        patch.after(model.path, last, "version_column", declared)
        patch.after(model.path, last, "version_mapper_args", args)

    return op
