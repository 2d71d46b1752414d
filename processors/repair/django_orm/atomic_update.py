"""The atomic update in Django: ``obj.f += x; obj.save()`` becomes one relative UPDATE the database evaluates.

``save()`` writes the value computed in Python from a stale read (``UPDATE t SET f = %s``: the lost update); the
repair is ``M.objects.filter(pk=obj.pk).update(f=F("f") + x)`` in place of the increment, and ``save()`` becomes
``obj.refresh_from_db(fields=["f"])``, so the code after it sees the value the database holds. A decrement is
guarded by the invariant it must keep (configured for the table as ``f >= n``, else the one a decrement implies,
``f >= 0``): ``filter(pk=obj.pk, f__gte=x)``; an UPDATE that then matches no row does what the function's own check
of that field does (its ``raise``, cloned: ``if not M.objects...update(...): raise ...``). Refused when ``save()``
also writes a field set in Python, or a guarded decrement has no check to clone. There is no SQL-level form: the
recorded UPDATE's parameter is the new value, the repaired one's the increment.
"""

from __future__ import annotations

import libcst as cst
from sqlglot import exp

from processors.repair.django_orm.code import commented, ensure_import, protected
from processors.repair.django_orm.models import resolve
from processors.repair.django_orm.querysets import OrmCall, calls_of
from processors.repair.edits import string_literal
from processors.repair.patch import Patch
from processors.repair.source import walk
from processors.repair.sql_edit import RewriteError, parse
from processors.repair.strategies.base import ATOMIC_UPDATE, Context, NotApplicable, Op, Outcome, Writer


def atomic_update(ctx: Context, w: Writer) -> Outcome:
    """Each ``obj.f += x`` before an unprotected ``save()`` as ``update(f=F("f") + x)``, guarded when it decrements."""
    protected(ctx.index, w)
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates:
        raise NotApplicable("no UPDATE to make relative")
    out = Outcome()
    for write in updates:
        saves = [c for c in calls_of(ctx.index, w, write.statement) if c.method == "save"]
        if not saves:
            raise NotApplicable(f"{write.statement!r} is not an instance's save()")
        for oc in saves:
            out.ops.append(_op(ctx, oc))
        out.repairs.append(ctx.info(ATOMIC_UPDATE, w, write.statement, write.statement))
        out.notes.append(f"{w.function}: {write.statement!r} is Django's save() of a value computed in Python: "
                         f"{ATOMIC_UPDATE} lets the database add the change (F expression)")  # fmt: skip
    return out


def _op(ctx: Context, oc: OrmCall) -> Op:
    """Check everything now; the patch operation edits the increments and the save()."""
    index, path = ctx.index, oc.path
    receiver = oc.call.func.value if isinstance(oc.call.func, cst.Attribute) else None
    if not isinstance(receiver, cst.Name):
        raise NotApplicable("save() is not called on a variable")
    obj = receiver.value
    named = resolve(index, path, oc.model.name)
    if named is None or named.table != oc.model.table:
        raise NotApplicable(f"{oc.model.name} is not the model's name in {path.name}")
    save = index.statement_of(path, oc.call)
    where = index.position(path, oc.call)
    if not isinstance(save, cst.SimpleStatementLine) or where is None:
        raise NotApplicable("save() is not a statement of its own")
    increments: list[tuple[cst.SimpleStatementLine, str, cst.AugAssign]] = []
    for node in walk(oc.func.body):
        at = index.position(path, node)
        if at is None or at.start.line >= where.start.line:
            continue
        target = node.target if isinstance(node, cst.AugAssign) else None
        if isinstance(node, cst.Assign):
            target = next((t.target for t in node.targets if _field_of(t.target, obj)), None)
            if target is not None:
                raise NotApplicable(f"save() also writes {obj}.{_field_of(target, obj)}, set in Python")
        field = _field_of(target, obj) if target is not None else None
        if isinstance(node, cst.AugAssign) and field:
            if not isinstance(node.operator, cst.AddAssign | cst.SubtractAssign):
                raise NotApplicable(f"{obj}.{field} is changed by an operator other than += or -=")
            line = index.statement_of(path, node)
            if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
                raise NotApplicable(f"{obj}.{field}'s increment is not a statement of its own")
            increments.append((line, field, node))
    if not increments:
        raise NotApplicable(f"no `{obj}.<field> += <value>` before {obj}.save()")
    guards = {f: _bound(ctx, oc, f) for _, f, n in increments if isinstance(n.operator, cst.SubtractAssign)}
    checks = {f: _check(oc.func, obj, f) for f, bound in guards.items() if bound is not None}
    text = f"repair({ATOMIC_UPDATE}): the database adds the change to the row's current value (no stale overwrite)"

    def op(patch: Patch) -> None:
        for line, field, node in increments:
            bound = guards.get(field)
            update = _update(oc.model.name, obj, field, node, bound)
            statement: cst.BaseStatement
            if bound is None:
                statement = cst.SimpleStatementLine([cst.Expr(update)])
            else:
                raised = checks[field]
                statement = cst.If(test=cst.UnaryOperation(cst.Not(), update),
                                   body=cst.IndentedBlock([raised.deep_clone()]))  # fmt: skip
            new = statement

            def edit(
                node: cst.CSTNode, new: cst.BaseStatement = new, line: cst.SimpleStatementLine = line
            ) -> cst.CSTNode:
                if isinstance(new, cst.SimpleStatementLine):
                    assert isinstance(node, cst.SimpleStatementLine)
                    return new.with_changes(leading_lines=node.leading_lines)
                assert isinstance(new, cst.BaseCompoundStatement)
                return commented(index, path, line, new, text, patch.line_length)

            patch.edit(path, line, ATOMIC_UPDATE, edit)
            if bound is None:
                patch.comment(path, line, text)
        fields = cst.List([cst.Element(string_literal(f)) for f in dict.fromkeys(f for _, f, _ in increments)])
        refresh = cst.Call(func=cst.Attribute(cst.Name(obj), cst.Name("refresh_from_db")),
                           args=[_kw("fields", fields)])  # fmt: skip
        patch.edit(path, save, ATOMIC_UPDATE, lambda node: save.with_changes(body=[cst.Expr(refresh)]))
        ensure_import(patch, index, path, "django.db.models", "F")

    return op


def _kw(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value`` (no spaces around ``=``)."""
    tight = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))
    return cst.Arg(value, keyword=cst.Name(name), equal=tight)


def _field_of(target: cst.BaseExpression, obj: str) -> str:
    """``f`` for ``obj.f`` ("" otherwise)."""
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == obj:
        return target.attr.value
    return ""


def _update(model: str, obj: str, field: str, node: cst.AugAssign, bound: int | None) -> cst.Call:
    """``M.objects.filter(pk=obj.pk[, f__gte=x + n]).update(f=F("f") ± x)``."""
    amount = node.value.deep_clone()
    keys = [_kw("pk", cst.Attribute(cst.Name(obj), cst.Name("pk")))]
    if bound is not None:
        least: cst.BaseExpression = amount if bound == 0 else cst.BinaryOperation(amount, cst.Add(),
                                                                                   cst.Integer(str(bound)))  # fmt: skip
        keys.append(_kw(f"{field}__gte", least))
    manager = cst.Attribute(cst.Name(model), cst.Name("objects"))
    filtered = cst.Call(func=cst.Attribute(manager, cst.Name("filter")), args=keys)
    operator = cst.Add() if isinstance(node.operator, cst.AddAssign) else cst.Subtract()
    value = cst.BinaryOperation(cst.Call(cst.Name("F"), [cst.Arg(string_literal(field))]), operator,
                                node.value.deep_clone())  # fmt: skip
    return cst.Call(func=cst.Attribute(filtered, cst.Name("update")), args=[_kw(field, value)])


def _bound(ctx: Context, oc: OrmCall, field: str) -> int | None:
    """The least value the column must keep (``f >= n`` configured, else 0 for a decrement)."""
    column = oc.model.columns.get(field, field)
    for text in ctx.invariants:
        try:
            tree = parse(f"SELECT 1 WHERE {text}")
        except RewriteError:
            continue
        for term in tree.find_all(exp.GTE, exp.GT):
            left, right = term.this, term.expression
            if isinstance(left, exp.Column) and left.name == column and isinstance(right, exp.Literal) and right.is_int:
                return int(right.this) + (1 if isinstance(term, exp.GT) else 0)
    return 0


def _check(func: cst.FunctionDef, obj: str, field: str) -> cst.BaseStatement:
    """The function's own check of ``obj.field`` (``if obj.f < x: raise ...``): its ``raise``."""
    for node in walk(func.body):
        if not isinstance(node, cst.If) or not isinstance(node.body, cst.IndentedBlock):
            continue
        if not any(_field_of(n, obj) == field for n in walk(node.test) if isinstance(n, cst.Attribute)):
            continue
        body = node.body.body
        if len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine) and isinstance(body[0].body[0], cst.Raise):
            return body[0]
    raise NotApplicable(f"no check of {obj}.{field} that raises: nothing to do when the guarded update matches no row")
