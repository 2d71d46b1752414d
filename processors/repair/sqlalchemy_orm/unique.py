"""The phantom's repair in SQLAlchemy code: the row the "none exists" query looked for is inserted with ``INSERT ...
ON CONFLICT (<columns>) DO NOTHING RETURNING <pk>``, so a unique index, not the stale read, decides.

``booking = Booking(room=room, day=day, ...)`` then ``session.add(booking)`` becomes
``booking.booking_id = session.scalar(insert(Booking).values(room=booking.room, ...)
.on_conflict_do_nothing(index_elements=["room", "day"]).returning(Booking.booking_id))`` (PostgreSQL's ``insert``),
followed by the check's own ``raise`` when no row came back (a concurrent request inserted it first): the code after
it, which reads ``booking.booking_id``, keeps working on the (unsaved) object. The columns are those the read pins
to one value each (``WHERE room = ... AND day = ...``), all set by the INSERT. The mapped class gets
``__table_args__ = (UniqueConstraint(...),)`` and the plan the migration (``CREATE UNIQUE INDEX``); the SQL-level
form is the recorded INSERT with ``ON CONFLICT (...) DO NOTHING``.
"""

from __future__ import annotations

from functools import partial

import libcst as cst

from processors.repair import sql_inserts
from processors.repair.classify import table_of
from processors.repair.edits import string_literal
from processors.repair.migration_files import alembic
from processors.repair.patch import Patch
from processors.repair.source import walk
from processors.repair.sqlalchemy_orm.calls import (
    Scope,
    callee,
    calls,
    code,
    defining_call,
    ensure_import,
    imported_as,
    names,
    scope_of,
)
from processors.repair.sqlalchemy_orm.models import Model, has_table_args, model_for, tablename_statement
from processors.repair.strategies.base import (
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    NotThisShape,
    Op,
    Outcome,
    Writer,
    rewrite,
)
from processors.repair.strategies.unique_insert import identity

_PG = "sqlalchemy.dialects.postgresql"


def unique_insert(ctx: Context, w: Writer) -> Outcome:
    """A unique constraint on what the read looked up, and the ``session.add`` as ``ON CONFLICT DO NOTHING``."""
    inserts = [a for a in w.writes if a.operation == "insert"]
    if not inserts:
        raise NotApplicable("no INSERT to guard")
    scope = scope_of(ctx.index, w)
    out = Outcome()
    for insert in inserts:
        table = table_of(insert.statement)
        model = model_for(ctx.index, w.path, table) if table else None
        if model is None or not model.orm or not model.primary_key:
            raise NotThisShape(f"no mapped class with a primary key for {table or insert.statement!r} in {w.rel}")
        columns = identity(w, insert.statement)
        edit = rewrite(partial(sql_inserts.on_conflict_do_nothing, insert.statement, columns))
        migration = rewrite(partial(sql_inserts.unique_index, insert.statement, columns))
        out.ops.append(_insert_op(ctx, scope, model, columns))
        out.ops.append(_constraint_op(ctx, model, columns))
        out.repairs.append(ctx.info(UNIQUE_INSERT, w, insert.statement, edit.after))
        out.rewrote(edit)
        if migration not in out.migrations:
            out.migrations.append(migration)
        name = migration.split(" EXISTS ", 1)[1].split(" ", 1)[0].strip('"')
        how = alembic.add_revision(out, model.path, ctx.index.root, migration, f"trace-repro: unique {name}",
                                   alembic.unique_constraint(name, str(table), columns))  # fmt: skip
        out.notes.append(f"{w.function}: {UNIQUE_INSERT}: session.add({model.name}(...)) becomes insert(...)"
                         f".on_conflict_do_nothing(index_elements={list(columns)}); no row back raises what the "
                         f"check raises; needs the migration {migration} ({how}; merge existing duplicates first; "
                         f"on a busy table, CREATE UNIQUE INDEX CONCURRENTLY)")  # fmt: skip
        if has_table_args(model.node) if model.node is not None else True:
            out.notes.append(f"{w.function}: {model.name} has __table_args__: add UniqueConstraint"
                             f"({', '.join(repr(c) for c in columns)}) to it")  # fmt: skip
    return out


def _insert_op(ctx: Context, scope: Scope, model: Model, columns: list[str]) -> Op:
    """The ``session.add`` statement replaced by the conflict-free insert and its no-row branch."""
    index, path = ctx.index, scope.path
    for fn in scope.defs:
        for call in calls(fn):
            if callee(call) != "add" or not isinstance(call.func, cst.Attribute) or len(call.args) != 1:
                continue
            arg = call.args[0].value
            obj = arg.value if isinstance(arg, cst.Name) else None
            built = defining_call(fn, obj, model.name) if obj is not None else arg
            if not isinstance(built, cst.Call) or not (isinstance(built.func, cst.Name)
                                                       and built.func.value == model.name):  # fmt: skip
                continue
            statement = index.statement_of(path, call)
            if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
                raise NotApplicable("session.add is not a statement of its own")
            found = _found_raise(ctx, scope, fn, model, statement)
            if any(a.keyword is None for a in built.args):
                raise NotApplicable(f"{model.name}(...) takes positional arguments: cannot name its columns")
            return partial(_replace_add, ctx=ctx, scope=scope, model=model, columns=columns, session=call.func.value,
                           obj=obj, built=built, statement=statement, found=found)  # fmt: skip
    raise NotApplicable(f"no session.add({model.name}(...)) in {scope.function.name.value} or its helpers")


def _found_raise(ctx: Context, scope: Scope, fn: cst.FunctionDef, model: Model,
                 add: cst.SimpleStatementLine) -> cst.SimpleStatementLine:  # fmt: skip
    """The ``raise`` of the last ``if <query on the model>: ... raise`` before the add (the "already exists" path)."""
    where = ctx.index.position(scope.path, add)
    found: cst.SimpleStatementLine | None = None
    for node in walk(fn):
        if not isinstance(node, cst.If) or not names(node.test, model.name):
            continue
        at = ctx.index.position(scope.path, node)
        if where is None or at is None or at.start.line >= where.start.line:
            continue
        last = node.body.body[-1] if isinstance(node.body, cst.IndentedBlock) and node.body.body else None
        if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Raise):
            found = last
    if found is None:
        raise NotApplicable(f"no `if <query on {model.name}>: raise ...` before the add: nothing to do when a "
                            "concurrent request inserted the row first")  # fmt: skip
    return found


def _replace_add(patch: Patch, *, ctx: Context, scope: Scope, model: Model, columns: list[str],
                 session: cst.BaseExpression, obj: str | None, built: cst.Call, statement: cst.SimpleStatementLine,
                 found: cst.SimpleStatementLine) -> None:  # fmt: skip
    path = scope.path
    insert = imported_as(ctx.index, path, _PG, "insert") or ensure_import(patch, ctx.index, path, _PG, "insert",
                                                                           "pg_insert")  # fmt: skip
    key = model.primary_key[0]
    values = ", ".join(f"{a.keyword.value}={obj}.{a.keyword.value}" if obj else f"{a.keyword.value}={code(a.value)}"
                       for a in built.args if a.keyword is not None)  # fmt: skip
    target = f"{obj}.{key}" if obj else f"{model.name.lower()}_{key}"
    elements = ", ".join(string_literal(c).value for c in columns)
    pad = "    "  # continuation lines, indented from the statement's own indentation
    text = (f"{target} = {code(session)}.scalar(\n{pad}{insert}({model.name}).values({values})\n"
            f"{pad}.on_conflict_do_nothing(index_elements=[{elements}])\n"
            f"{pad}.returning({model.name}.{key})\n)\n")  # fmt: skip
    new = cst.parse_statement(text)
    patch.edit(path, statement, "unique_insert", lambda node: new.with_changes(leading_lines=statement.leading_lines))
    check = cst.parse_statement(f"if {target} is None:  # a concurrent request inserted it first\n    pass\n")
    assert isinstance(check, cst.If) and isinstance(check.body, cst.IndentedBlock)
    raised = found.deep_clone().with_changes(leading_lines=())
    patch.after(path, statement, "unique_insert:none", check.with_changes(body=check.body.with_changes(body=[raised])))


def _constraint_op(ctx: Context, model: Model, columns: list[str]) -> Op:
    """``__table_args__ = (UniqueConstraint(...),)`` after ``__tablename__`` (when the class has no table args)."""

    def op(patch: Patch) -> None:
        if model.node is None or has_table_args(model.node):
            return
        after = tablename_statement(model.node)
        assert after is not None
        name = ensure_import(patch, ctx.index, model.path, "sqlalchemy", "UniqueConstraint")
        listed = ", ".join(string_literal(c).value for c in columns)
        patch.after(
            model.path, after, "unique_constraint", cst.parse_statement(f"__table_args__ = ({name}({listed}),)\n")
        )

    return op
