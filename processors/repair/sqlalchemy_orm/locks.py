"""Row locks in SQLAlchemy code: the writer's unlocked read, found as the ORM call that issues it, takes ``FOR
UPDATE`` (``FOR SHARE`` for a reader).

Which call issued a recorded read is told by its shape as SQLAlchemy renders it: ``WHERE <pk> = %(pk_1)s`` is
``session.get(Model, key)``; an aggregate (``SELECT count(*) ...``) is a ``select(func.count())`` chain; any other
SELECT of the table is a ``select(...)`` chain naming the model. The edits:

- ``session.get(M, k)`` → ``session.get(M, k, with_for_update=True)``; when it sits in a helper that already takes a
  flag for it (``def _account(session, no, *, lock=False): session.get(..., with_for_update=lock)``), the writer's
  call of the helper passes ``lock=True`` instead, so the helper's other callers keep their behaviour;
- ``select(...)...`` → ``select(...)....with_for_update()``;
- an aggregate cannot carry the lock (PostgreSQL refuses ``FOR UPDATE`` with aggregates): it counts the rows of a
  subquery that locks them, ``select(func.count()).select_from(select(M.pk).where(<p>).with_for_update()
  .subquery())`` (PostgreSQL accepts a locking clause in a sub-SELECT in FROM, and locks the rows it returns).

The SQL-level form is the recorded SELECT with the lock clause (or its locking subquery), as the raw-SQL strategy
writes it (:mod:`processors.repair.sql_rewrite`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import libcst as cst
from sqlglot import exp

from processors.model.outputs import AccessInfo
from processors.repair.classify import table_of
from processors.repair.patch import Patch
from processors.repair.sql_edit import RewriteError, parse
from processors.repair.sqlalchemy_orm.calls import (
    Chain,
    Scope,
    calls,
    code,
    names,
    scope_of,
    select_chains,
    session_gets,
)
from processors.repair.sqlalchemy_orm.models import Model, model_for
from processors.repair.strategies.base import (
    ROW_LOCK,
    SHARE_LOCK,
    Context,
    NotApplicable,
    NotThisShape,
    Op,
    Outcome,
    Writer,
    rewrite,
)
from processors.repair.strategies.row_lock import locked


def row_lock(ctx: Context, w: Writer) -> Outcome:
    """The unlocked reads before the write take ``FOR UPDATE`` (``with_for_update``)."""
    return _locked(ctx, w, ROW_LOCK, share=False)


def share_lock(ctx: Context, w: Writer) -> Outcome:
    """The reader's unlocked reads take ``FOR SHARE`` (``with_for_update(read=True)``)."""
    return _locked(ctx, w, SHARE_LOCK, share=True)


def _locked(ctx: Context, w: Writer, strategy: str, *, share: bool) -> Outcome:
    if not w.reads:
        raise NotApplicable("no unlocked read precedes the write")
    scope = scope_of(ctx.index, w)
    out = Outcome()
    for read in w.reads:
        model = _model(ctx, w, read)
        ops, note = _read_ops(ctx, scope, model, read, share=share)
        edit = rewrite(partial(locked, read.statement, share=share))
        out.ops += ops
        out.repairs.append(ctx.info(strategy, w, read.statement, edit.after))
        out.rewrote(edit)
        out.notes.append(f"{w.function}: {strategy}: {note}")
    return out


def _model(ctx: Context, w: Writer, access: AccessInfo) -> Model:
    table = table_of(access.statement)
    if not table:
        raise NotApplicable(f"cannot tell the table of {access.statement!r}")
    model = model_for(ctx.index, w.path, table)
    if model is None:
        raise NotThisShape(f"no SQLAlchemy model of {table} in {w.rel}")
    return model


def _kind(statement: str) -> str:
    """How SQLAlchemy built a recorded SELECT: ``get`` (by primary key), ``aggregate`` or ``select``."""
    try:
        tree = parse(statement)
    except RewriteError as exc:
        raise NotApplicable(str(exc)) from exc
    if not isinstance(tree, exp.Select):
        raise NotApplicable("the read is not a SELECT")
    if any(e.find(exp.AggFunc) is not None for e in tree.expressions):
        return "aggregate"
    return "get" if "%(pk_" in statement else "select"


def _read_ops(ctx: Context, scope: Scope, model: Model, read: AccessInfo, *, share: bool) -> tuple[list[Op], str]:
    """The edits that lock the read's rows at its ORM call, and what they do."""
    kind = _kind(read.statement)
    for fn in scope.defs:
        if kind == "get":
            for call in session_gets(fn, model.name):
                return _lock_get(ctx, scope, fn, call, share=share)
        else:
            chains = [c for c in select_chains(ctx.index, scope.path, fn, model.name)
                      if c.aggregate() == (kind == "aggregate") and "with_for_update" not in dict(c.steps)]  # fmt: skip
            if len(chains) > 1:
                raise NotApplicable(f"{len(chains)} select() chains on {model.name} in {fn.name.value}: which one ran")
            if chains:
                return _lock_chain(scope, fn, chains[0], model, share=share)
    what = {"get": f"session.get({model.name}, ...)", "aggregate": f"an aggregate select() on {model.name}",
            "select": f"a select() on {model.name}"}[kind]  # fmt: skip
    raise NotApplicable(f"{what} not found in {scope.function.name.value} or the helpers it calls")


def _lock_arg(share: bool) -> str:
    return '{"read": True}' if share else "True"


def _lock_get(ctx: Context, scope: Scope, fn: cst.FunctionDef, call: cst.Call, *,
              share: bool) -> tuple[list[Op], str]:  # fmt: skip
    """``session.get(M, k)`` locked: through the helper's flag when it has one, else the call itself."""
    given = next((a for a in call.args if a.keyword is not None and a.keyword.value == "with_for_update"), None)
    flag = _helper_flag(fn, given) if fn is not scope.function else None
    if flag is not None and not share:
        helper = fn.name.value
        sites = _calls_of(scope.function, helper)
        if not sites:
            raise NotApplicable(f"{scope.function.name.value} does not call {helper}")
        ops = [_edit(scope, c, f"lock:{flag}", partial(_with_kw, keyword=flag, value="True")) for c in sites]
        return ops, f"{helper}(..., {flag}=True): the helper's own flag reads the row with_for_update"
    if given is not None and code(given.value) not in ("False", "None"):
        raise NotApplicable(f"session.get already passes with_for_update={code(given.value)}")
    value = _lock_arg(share)
    note = f"session.get(..., with_for_update={value})"
    if fn is not scope.function:
        note += f" in {fn.name.value} (every caller of {fn.name.value} locks the row from now on)"
    return [_edit(scope, call, "with_for_update", partial(_with_kw, keyword="with_for_update", value=value))], note


def _helper_flag(fn: cst.FunctionDef, given: cst.Arg | None) -> str | None:
    """The helper's parameter passed as ``with_for_update=<param>`` (a flag that defaults to off)."""
    if given is None or not isinstance(given.value, cst.Name):
        return None
    name = given.value.value
    params = [*fn.params.params, *fn.params.kwonly_params]
    found = next((p for p in params if p.name.value == name), None)
    if found is None or found.default is None or code(found.default) not in ("False", "None"):
        return None
    return name


def _calls_of(fn: cst.FunctionDef, name: str) -> list[cst.Call]:
    return [c for c in calls(fn) if isinstance(c.func, cst.Name) and c.func.value == name]


def _lock_chain(scope: Scope, fn: cst.FunctionDef, chain: Chain, model: Model, *,
                share: bool) -> tuple[list[Op], str]:  # fmt: skip
    lock = "with_for_update(read=True)" if share else "with_for_update()"
    where = f" in {fn.name.value}" if fn is not scope.function else ""
    if not chain.aggregate():
        op = _edit(scope, chain.outer, "lock", lambda node: cst.parse_expression(f"{code(node)}.{lock}"))
        return [op], f"the select() on {model.name}{where} takes .{lock}"
    if not model.primary_key:
        raise NotApplicable(f"{model.name} declares no primary key to select the rows to lock by")
    methods = [m for m, _ in chain.steps[1:]]
    if set(methods) - {"select_from", "where", "filter"} or methods.count("select_from") != 1:
        raise NotApplicable(f"the aggregate select() is chained with {', '.join(methods)}: not a plain count")
    if any(names(a.value, model.name) for a in chain.select.args):
        raise NotApplicable("the aggregate names the model's columns: it cannot read them from a subquery")
    conditions = [a.value for m, call in chain.steps[1:] if m != "select_from" for a in call.args]
    key = model.primary_key[0]
    inner = f"select({model.name}.{key})"
    if conditions:
        inner += f".where({', '.join(code(c) for c in conditions)})"
    text = f"{code(chain.select)}.select_from(\n    {inner}.{lock}.subquery())"  # (indented from its statement)
    op = _edit(scope, chain.outer, "lock", lambda node: cst.parse_expression(text))
    return [op], (f"the aggregate select() on {model.name}{where} counts the rows of a subquery that selects them "
                  f"{lock} (PostgreSQL refuses FOR UPDATE with an aggregate)")  # fmt: skip


def _edit(scope: Scope, node: cst.CSTNode, key: str, edit: Callable[[cst.CSTNode], cst.CSTNode]) -> Op:
    def op(patch: Patch) -> None:
        patch.edit(scope.path, node, key, edit)

    return op


def _with_kw(node: cst.CSTNode, *, keyword: str, value: str) -> cst.CSTNode:
    """The call with ``keyword=value`` (replacing the keyword's value when it is passed already)."""
    assert isinstance(node, cst.Call)
    new = cst.parse_expression(value)
    args = list(node.args)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value == keyword:
            args[i] = a.with_changes(value=new)
            return node.with_changes(args=args)
    if args:
        args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    args.append(
        cst.Arg(
            value=new,
            keyword=cst.Name(keyword),
            equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
            ),
        )
    )
    return node.with_changes(args=args)
