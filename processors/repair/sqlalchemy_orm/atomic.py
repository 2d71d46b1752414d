"""The atomic update in SQLAlchemy code: a value computed in Python from a read (``account.balance += amount``)
becomes an UPDATE that computes it in the database, on the row's newest version.

``obj.attr += x`` (or ``obj.attr = obj.attr - x``), where ``obj`` came from ``session.get(M, key)`` (directly, or
through a helper of the module that returns it), becomes ``session.execute(update(M).where(M.pk == key)
.values(attr=M.attr + x))``. With an invariant on the column (configured, ``balance >= 0``, or the one a decrement
implies: the column stays non-negative) the UPDATE is guarded by it on the new value and returns the key; no row
back means the guard failed, and the code raises what its last check before the change raises (else
``LookupError``). The SQL-level form is the recorded UPDATE with the invariant (:mod:`processors.repair.sql_rewrite`)
where its placeholders allow one.
"""

from __future__ import annotations

import libcst as cst
from sqlglot import exp

from processors.repair import sql_rewrite
from processors.repair.classify import table_of
from processors.repair.edits import string_literal
from processors.repair.patch import Patch
from processors.repair.source import walk
from processors.repair.sql_edit import RewriteError, parse
from processors.repair.sqlalchemy_orm.calls import Scope, code, ensure_import, scope_of, session_gets
from processors.repair.sqlalchemy_orm.models import Model, model_for
from processors.repair.strategies.base import ATOMIC_UPDATE, Context, NotApplicable, NotThisShape, Op, Outcome, Writer

_SESSION_METHODS = frozenset({"flush", "execute", "scalar", "scalars", "get", "add", "commit"})
_OPS = {">=": ">=", ">": ">", "<=": "<=", "<": "<"}


def atomic_update(ctx: Context, w: Writer) -> Outcome:
    """The attribute change computed from a read → ``update(M).where(...).values(attr=M.attr ± x)``."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates or not w.reads:
        raise NotApplicable("no UPDATE after a read")
    scope = scope_of(ctx.index, w)
    out = Outcome()
    for update in updates:
        table = table_of(update.statement)
        model = model_for(ctx.index, w.path, table) if table else None
        if model is None or not model.orm or not model.primary_key:
            raise NotThisShape(f"no mapped class with a primary key for {table or update.statement!r} in {w.rel}")
        change = _change(ctx, scope, model, _set_columns(update.statement))
        guard = _guard(ctx, update.statement, change[2], change[3])
        out.ops.append(_op(ctx, scope, model, change, guard))
        try:
            edit = sql_rewrite.atomic_update(update.statement, [*ctx.invariants] or [f"{change[2]} >= 0"])
        except RewriteError:
            out.repairs.append(ctx.info(ATOMIC_UPDATE, w, update.statement, update.statement))
        else:
            out.repairs.append(ctx.info(ATOMIC_UPDATE, w, update.statement, edit.after))
            out.rewrote(edit)
        guarded = f", guarded by {change[2]} {guard}" if guard else ""
        out.notes.append(f"{w.function}: {ATOMIC_UPDATE}: {change[1]}.{change[2]} {change[3]}= ... becomes an UPDATE "
                         f"of {model.name} computed in the database{guarded} (the loaded object gets the value "
                         "SQLAlchemy evaluates in Python: session.refresh it where the new value matters)")  # fmt: skip
    return out


def _set_columns(statement: str) -> set[str]:
    try:
        tree = parse(statement)
    except RewriteError as exc:
        raise NotApplicable(str(exc)) from exc
    if not isinstance(tree, exp.Update):
        raise NotApplicable("the write is not an UPDATE")
    return {e.this.name for e in tree.expressions if isinstance(e, exp.EQ) and isinstance(e.this, exp.Column)}


# (the statement, the object's name, the attribute, "+" or "-", the delta, the key expression, the session, the def)
_Change = tuple[cst.SimpleStatementLine, str, str, str, cst.BaseExpression, str, str, cst.FunctionDef]


def _change(ctx: Context, scope: Scope, model: Model, columns: set[str]) -> _Change:
    """The ``obj.attr += x`` (or ``obj.attr = obj.attr - x``) line on a row of ``model``, with its key."""
    for fn in scope.defs:
        for stmt in walk(fn):
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            found = _delta(stmt.body[0])
            if found is None or found[1] not in columns:
                continue
            obj, attr, sign, delta = found
            key = _key(ctx, scope, fn, obj, model)
            if key is None:
                continue
            return stmt, obj, attr, sign, delta, key, _session(fn), fn
    raise NotApplicable(f"no `<row>.<column> += ...` on a {model.name} read by session.get in "
                        f"{scope.function.name.value} or its helpers")  # fmt: skip


def _delta(small: cst.BaseSmallStatement) -> tuple[str, str, str, cst.BaseExpression] | None:
    if isinstance(small, cst.AugAssign) and isinstance(small.operator, cst.AddAssign | cst.SubtractAssign):
        target, sign, delta = small.target, "+" if isinstance(small.operator, cst.AddAssign) else "-", small.value
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.BinaryOperation):
        target, value = small.targets[0].target, small.value
        if not isinstance(value.operator, cst.Add | cst.Subtract) or code(value.left) != code(target):
            return None
        sign, delta = "+" if isinstance(value.operator, cst.Add) else "-", value.right
    else:
        return None
    if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name):
        return target.value.value, target.attr.value, sign, delta
    return None


def _key(ctx: Context, scope: Scope, fn: cst.FunctionDef, obj: str, model: Model) -> str | None:
    """The key expression ``obj`` was read by: ``obj = session.get(M, key)``, or ``obj = helper(..., key)`` where
    the helper reads ``session.get(M, <its parameter>)``."""
    for node in walk(fn):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call)):
            continue
        target, call = node.targets[0].target, node.value
        if not (isinstance(target, cst.Name) and target.value == obj):
            continue
        if call in session_gets(fn, model.name) and len(call.args) >= 2:
            return code(call.args[1].value)
        helper = next((h for h in scope.helpers if isinstance(call.func, cst.Name)
                       and h.name.value == call.func.value), None)  # fmt: skip
        gets = session_gets(helper, model.name) if helper is not None else []
        if helper is None or len(gets) != 1 or len(gets[0].args) < 2 or not isinstance(gets[0].args[1].value, cst.Name):
            return None
        param = gets[0].args[1].value.value
        names = [p.name.value for p in helper.params.params]
        for i, arg in enumerate(call.args):
            if (arg.keyword is None and i < len(names) and names[i] == param) or (
                arg.keyword is not None and arg.keyword.value == param
            ):
                return code(arg.value)
    return None


def _session(fn: cst.FunctionDef) -> str:
    """The name the function calls session methods on (``session.flush()``)."""
    for node in walk(fn):
        func = node.func if isinstance(node, cst.Call) else None
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.attr.value in _SESSION_METHODS:
            return func.value.value
    raise NotApplicable(f"no session used in {fn.name.value}")


def _guard(ctx: Context, statement: str, attr: str, sign: str) -> str:
    """The invariant on ``attr`` as a comparison of the new value (its text: ``>= 0``), "" when none applies."""
    invariants = list(ctx.invariants)
    if not invariants and sign == "-":
        invariants = [f"{attr} >= 0"]
    for text in invariants:
        parts = text.split()
        if len(parts) == 3 and parts[0] == attr and parts[1] in _OPS:
            try:
                float(parts[2])
            except ValueError:
                continue
            return f"{parts[1]} {parts[2]}"
    return ""


def _op(ctx: Context, scope: Scope, model: Model, change: _Change, guard: str) -> Op:
    stmt, _, attr, sign, delta, key, session, fn = change

    def op(patch: Patch) -> None:
        update = ensure_import(patch, ctx.index, scope.path, "sqlalchemy", "update")
        pk = model.primary_key[0]
        amount = code(delta) if isinstance(delta, cst.Name | cst.Integer) else f"({code(delta)})"
        new = f"{model.name}.{attr} {sign} {amount}"
        where = f"{model.name}.{pk} == {key}" + (f", {new} {guard}" if guard else "")
        built = f"\n    {update}({model.name}).where({where})\n    .values({attr}={new})"  # (indented from its line)
        if not guard:
            line = cst.parse_statement(f"{session}.execute({built}\n)\n")
            patch.edit(
                scope.path, stmt, ATOMIC_UPDATE, lambda node: line.with_changes(leading_lines=stmt.leading_lines)
            )
            return
        refusal = string_literal(f"{attr} {sign} {code(delta)} would break {attr} {guard}").value
        raised = _last_raise(fn, stmt) or cst.parse_statement(f"raise LookupError({refusal})\n")
        check = cst.parse_statement(f"if {session}.execute({built}.returning({model.name}.{pk})\n).first() is None:"
                                    "  # the guard failed\n    pass\n")  # fmt: skip
        assert isinstance(check, cst.If) and isinstance(check.body, cst.IndentedBlock)
        body = check.body.with_changes(body=[raised.deep_clone().with_changes(leading_lines=())])
        patch.edit(scope.path, stmt, ATOMIC_UPDATE,
                   lambda node: check.with_changes(body=body, leading_lines=stmt.leading_lines))  # fmt: skip

    return op


def _last_raise(fn: cst.FunctionDef, before: cst.CSTNode) -> cst.SimpleStatementLine | None:
    """The last ``raise`` line of an ``if`` body in ``fn`` before ``before`` (the code's own refusal)."""
    found = None
    for node in walk(fn):
        if node is before:
            break
        if isinstance(node, cst.If) and isinstance(node.body, cst.IndentedBlock):
            last = node.body.body[-1] if node.body.body else None
            if isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Raise):
                found = last
    return found
