"""The unique insert in Django: the phantom's "none exists, so create" made impossible by the database.

The writer checked that no row exists (``if M.objects.filter(a=x, b=y).exists(): raise Taken(...)``) and then
created one; two requests doing that at once both create. The columns the check's SELECT pins to one value each
are the identity of what it looked for: the model declares ``UniqueConstraint(fields=[...])`` on them (the schema
change is the plan's migration), and the ``create(...)`` runs in its own ``transaction.atomic()`` (a savepoint, so
the request's transaction stays usable) with the ``IntegrityError`` of the losing request turned into what the
code's own check does when it finds a row (that ``raise`` or ``return``, cloned).

``get_or_create`` is not used: it would hand the loser the winner's row, where this code refuses (its check raises);
the cloned branch keeps the code's answer to "the row exists" for the race as for the sequential case. Refused when
the check's branch uses the row it found, or when no such check is next to the ``create``. The SQL-level form is
the recorded INSERT with ``ON CONFLICT (<columns>) DO NOTHING`` and the unique index.
"""

from __future__ import annotations

from functools import partial

import libcst as cst

from processors.repair import sql_inserts
from processors.repair.django_orm.code import commented, ensure_import, imported, protected
from processors.repair.django_orm.models import Model
from processors.repair.django_orm.querysets import OrmCall, calls_of, described
from processors.repair.edits import string_literal
from processors.repair.migration_files import django as migrations
from processors.repair.patch import Patch
from processors.repair.source import walk
from processors.repair.sql_edit import RewriteError
from processors.repair.strategies.base import UNIQUE_INSERT, Context, NotApplicable, Op, Outcome, Writer, rewrite

_GUARD = """\
try:
    with transaction.atomic():
        pass
except IntegrityError:
    pass
"""


def unique_insert(ctx: Context, w: Writer) -> Outcome:
    """A ``UniqueConstraint`` on what the check looked up, and the ``create()`` guarded against its violation."""
    protected(ctx.index, w)
    inserts = [a for a in w.writes if a.operation == "insert"]
    if not inserts:
        raise NotApplicable("no INSERT to guard")
    out = Outcome()
    for insert in inserts:
        creates = calls_of(ctx.index, w, insert.statement)
        columns, checks = _identity(ctx, w, insert.statement)
        model = creates[0].model
        fields = _fields(model, columns)
        ordered = [model.columns[f] for f in fields]
        edit = rewrite(partial(sql_inserts.on_conflict_do_nothing, insert.statement, ordered))
        migration = rewrite(partial(sql_inserts.unique_index, insert.statement, ordered))
        name = migration.split(" EXISTS ", 1)[1].split(" ", 1)[0].strip('"')
        for oc in creates:
            found = _found_branch(ctx, oc, checks)
            out.notes.append(
                f"{w.function}: {insert.statement!r} is Django's, from {described(ctx.index, oc)}, after "
                f"a check that found no row ({described(ctx.index, checks[0])}): {UNIQUE_INSERT} makes "
                "the database refuse the second row; the loser answers as when the check finds one"
            )
            out.ops.append(_guard_op(oc, found, model, fields))
        out.ops.append(_constraint_op(model, fields, name))
        out.repairs.append(ctx.info(UNIQUE_INSERT, w, insert.statement, edit.after))
        out.rewrote(edit)
        if migration not in out.migrations:
            out.migrations.append(migration)
        how = _migration(out, model, fields, name)
        out.notes.append(f"{w.function}: {UNIQUE_INSERT} needs the constraint {name} on {model.table} "
                         f"({', '.join(ordered)}): {migration} ({how}; merge existing duplicates first)")  # fmt: skip
    return out


def _migration(out: Outcome, model: Model, fields: list[str], name: str) -> str:
    """The migration file adding the constraint, when the app has a migrations package; what the note says."""
    package = migrations.migrations_dir(model.path)
    if package is None:
        return "the app has no migrations package"
    try:
        migrations.latest(package, {})
    except NotApplicable as exc:
        return f"no migration file: {exc}"
    label = migrations.app_label(model.path, model.meta)
    out.ops.append(migrations.add_constraint_op(package, label, model.name, fields, name))
    return f"the plan adds it as a migration of {label}"


def _identity(ctx: Context, w: Writer, insert: str) -> tuple[list[str], list[OrmCall]]:
    """The columns a read of the writer pins to one value each (all set by the INSERT), and that read's calls."""
    why = "no read before the INSERT looks its row up"
    for read in w.reads:
        try:
            columns = sql_inserts.equality_columns(read.statement)
            sql_inserts.on_conflict_do_nothing(insert, columns)
            checks = calls_of(ctx.index, w, read.statement)
        except (RewriteError, NotApplicable) as exc:
            why = str(exc)
            continue
        return columns, checks
    raise NotApplicable(f"no unique key to conflict on: {why}")


def _fields(model: Model, columns: list[str]) -> list[str]:
    """The model's fields for ``columns``, in the model's order."""
    fields = [f for f, c in model.columns.items() if c in columns]
    if len(fields) != len(set(columns)):
        raise NotApplicable(f"{model.name} has no field for some of {', '.join(columns)}")
    return fields


def _found_branch(ctx: Context, oc: OrmCall, checks: list[OrmCall]) -> cst.BaseStatement:
    """What the code does when its check finds the row: the one ``raise``/``return`` of the ``if`` that tests the
    check, in the function of the ``create`` (refused when it uses what the check returned)."""
    statement = ctx.index.statement_of(oc.path, oc.call)
    for check in checks:
        if check.func is not oc.func:
            continue
        node = ctx.index.parent(oc.path, check.call)
        while node is not None and not isinstance(node, cst.If | cst.FunctionDef):
            node = ctx.index.parent(oc.path, node)
        if not isinstance(node, cst.If) or node.orelse is not None or not isinstance(node.body, cst.IndentedBlock):
            continue
        body = node.body.body
        if not (len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1
                and isinstance(body[0].body[0], cst.Raise | cst.Return)):  # fmt: skip
            raise NotApplicable("the check's branch does more than raise or return")
        if any(isinstance(n, cst.NamedExpr) for n in walk(node.test)):
            raise NotApplicable("the check's branch uses the row it found")
        if not isinstance(statement, cst.SimpleStatementLine):
            raise NotApplicable("the create() is not a statement of its own")
        return body[0]
    raise NotApplicable(f"no `if <check>: raise/return` before the create() in {oc.func.name.value}")


def _guard_op(oc: OrmCall, found: cst.BaseStatement, model: Model, fields: list[str]) -> Op:
    text = (f"repair({UNIQUE_INSERT}): UNIQUE ({', '.join(fields)}) on {model.name}: a concurrent request's row "
            "makes this create fail; then as when the check finds one")  # fmt: skip

    def op(patch: Patch) -> None:
        index = patch.index
        statement = index.statement_of(oc.path, oc.call)
        assert isinstance(statement, cst.SimpleStatementLine)

        def guard(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.SimpleStatementLine)
            template = cst.parse_statement(_GUARD)  # a fixed template: no input becomes code
            assert isinstance(template, cst.Try) and isinstance(template.body, cst.IndentedBlock)
            block = template.body.body[0]
            assert isinstance(block, cst.With) and isinstance(block.body, cst.IndentedBlock)
            block = block.with_changes(body=block.body.with_changes(body=[node.with_changes(leading_lines=())]))
            handler = template.handlers[0]
            assert isinstance(handler.body, cst.IndentedBlock)
            handler = handler.with_changes(body=handler.body.with_changes(body=[found.deep_clone()]))
            guarded = template.with_changes(body=template.body.with_changes(body=[block]), handlers=[handler])
            return commented(index, oc.path, statement, guarded, text, patch.line_length)

        patch.edit(oc.path, statement, UNIQUE_INSERT, guard)
        ensure_import(patch, index, oc.path, "django.db", "IntegrityError")
        ensure_import(patch, index, oc.path, "django.db", "transaction")

    return op


def _constraint_op(model: Model, fields: list[str], name: str) -> Op:
    def op(patch: Patch) -> None:
        prefix = "models." if imported(patch.index, model.path, "django.db", "models") else ""
        if not prefix:
            ensure_import(patch, patch.index, model.path, "django.db.models", "UniqueConstraint")
        listed = ", ".join(string_literal(f).value for f in fields)
        constraint = cst.parse_expression(f"{prefix}UniqueConstraint(fields=[{listed}], "
                                          f"name={string_literal(name).value})")  # fmt: skip
        meta = model.meta
        if meta is None:
            patch.edit(model.path, model.node, UNIQUE_INSERT, partial(_with_meta, constraint=constraint))
        else:
            patch.edit(model.path, meta, UNIQUE_INSERT, partial(_with_constraint, constraint=constraint))

    return op


def _with_constraint(node: cst.CSTNode, *, constraint: cst.BaseExpression) -> cst.CSTNode:
    """``class Meta`` with the constraint appended to its ``constraints = [...]`` (or that line added)."""
    assert isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock)
    body = list(node.body.body)
    for i, stmt in enumerate(body):
        small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
            continue
        target = small.targets[0].target
        if isinstance(target, cst.Name) and target.value == "constraints":
            if not isinstance(small.value, cst.List | cst.Tuple):
                raise NotApplicable("Meta.constraints is not a list literal")
            elements = [*small.value.elements]
            if elements:
                elements[-1] = elements[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            value = small.value.with_changes(elements=[*elements, cst.Element(constraint)])
            assert isinstance(stmt, cst.SimpleStatementLine)
            body[i] = stmt.with_changes(body=[small.with_changes(value=value)])
            return node.with_changes(body=node.body.with_changes(body=body))
    line = cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name("constraints"))],
                                               cst.List([cst.Element(constraint)]))])  # fmt: skip
    return node.with_changes(body=node.body.with_changes(body=[*body, line]))


def _with_meta(node: cst.CSTNode, *, constraint: cst.BaseExpression) -> cst.CSTNode:
    """The model with a ``class Meta`` holding only the constraint."""
    assert isinstance(node, cst.ClassDef) and isinstance(node.body, cst.IndentedBlock)
    meta = cst.ClassDef(name=cst.Name("Meta"), body=cst.IndentedBlock([cst.SimpleStatementLine(
        [cst.Assign([cst.AssignTarget(cst.Name("constraints"))], cst.List([cst.Element(constraint)]))])]),
        leading_lines=[cst.EmptyLine()])  # fmt: skip
    return node.with_changes(body=node.body.with_changes(body=[*node.body.body, meta]))
