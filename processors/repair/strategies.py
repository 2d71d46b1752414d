"""The five repair strategies, each applied to one unprotected writer: the statements it rewrites and the code
around them it needs (new parameters, the "no row" path, a retry loop).

A strategy checks everything first and raises :class:`NotApplicable` with the reason when it cannot repair the
writer; otherwise it returns the edits as operations on a :class:`Patch`, so a plan never holds half a repair.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Final

import libcst as cst
from sqlglot import exp

from processors.repair import sql_rewrite
from processors.repair.classify import lock_of
from processors.repair.locate import CallSite, SourceError, SourceIndex, bound_names, walk
from processors.repair.patch import Patch, string_literal
from processors.repair.sql_rewrite import CopyParam, RewriteError, SqlEdit, VarParam
from processors.sql_access import SqlAccessExtractor
from streamer.schemas import AccessInfo, RepairInfo

ROW_LOCK: Final = "row_lock"
ATOMIC_UPDATE: Final = "atomic_update"
OPTIMISTIC_VERSION: Final = "optimistic_version"
STRICTER_ISOLATION: Final = "stricter_isolation"
IDEMPOTENCY_GUARD: Final = "idempotency_guard"
_KEY_NAME: Final = re.compile(r"(?:.*_)?(?:idempotency_key|idem_?key|request_key|key)$")
_SET_SERIALIZABLE: Final = "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"

Op = Callable[[Patch], None]


class NotApplicable(Exception):
    """The strategy cannot repair this writer (the message says why)."""


@dataclass(frozen=True, slots=True)
class Writer:
    """One code path that writes the entity unprotected, with the unlocked reads it does before."""

    function: str
    file: str  # as the app recorded it
    path: Path  # the local file
    rel: str  # relative to the root, for diffs and RepairInfo
    writes: tuple[AccessInfo, ...]
    reads: tuple[AccessInfo, ...]


@dataclass(frozen=True, slots=True)
class Context:
    """What every strategy needs: the parsed sources and the configuration of the planning."""

    index: SourceIndex
    invariants: tuple[str, ...] = ()
    version_columns: tuple[str, ...] = ("version",)
    idempotency_column: str = "idempotency_key"
    extractor: SqlAccessExtractor | None = None

    def lock(self, statement: str) -> str:
        return lock_of(statement, self.extractor, self.version_columns)

    def sites(self, w: Writer, statement: str) -> list[CallSite]:
        try:
            found = self.index.call_sites(w.path, w.function, statement)
        except SourceError as exc:
            raise NotApplicable(str(exc)) from exc
        if not found:
            raise NotApplicable(f"statement {statement!r} not found in {w.function} ({w.rel})")
        return found

    def info(self, strategy: str, w: Writer, before: str, after: str) -> RepairInfo:
        return RepairInfo(
            strategy=strategy,
            file=w.rel,
            function=w.function,
            statement_before=before,
            statement_after=after,
            lock_before=self.lock(before),
            lock_after=self.lock(after),
        )


@dataclass(slots=True)
class Outcome:
    """One writer repaired: the RepairInfos, the patch operations, the SQL-level rewrites."""

    repairs: list[RepairInfo] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    sql: list[dict[str, str]] = field(default_factory=list)


def _edit(rewrite: Callable[[], SqlEdit]) -> SqlEdit:
    try:
        return rewrite()
    except RewriteError as exc:
        raise NotApplicable(str(exc)) from exc


def _sql_op(site: CallSite, recorded: str, edit: SqlEdit, values: Sequence[tuple[int, cst.BaseExpression]]) -> Op:
    def op(patch: Patch) -> None:
        patch.sql(site, recorded, edit.insertions)
        patch.params(site, values)

    return op


def _param_values(site: CallSite, edit: SqlEdit, roles: dict[str, str]) -> list[tuple[int, cst.BaseExpression]]:
    """The expressions to bind to the edit's new placeholders at ``site`` (checked to be editable)."""
    if not edit.new_params:
        return []
    func = site.call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "executemany":
        raise NotApplicable("executemany: cannot add a parameter to every row")
    params = site.params
    if not isinstance(params, cst.Tuple | cst.List):
        raise NotApplicable("the statement's parameters are not a tuple or list literal")
    values: list[tuple[int, cst.BaseExpression]] = []
    for index, source in edit.new_params:
        if isinstance(source, CopyParam):
            if source.index >= len(params.elements):
                raise NotApplicable("a placeholder has no parameter in the tuple")
            values.append((index, params.elements[source.index].value))
        elif isinstance(source, VarParam):
            values.append((index, cst.Name(roles[source.role])))
    return values


# -- row lock --------------------------------------------------------------------------------------------------
def row_lock(ctx: Context, w: Writer) -> Outcome:
    """The unlocked read before the write becomes ``SELECT ... FOR UPDATE``."""
    if not w.reads:
        raise NotApplicable("no unlocked read precedes the write")
    out = Outcome()
    for read in w.reads:
        edit = _edit(partial(sql_rewrite.row_lock, read.statement))
        out.ops += [_sql_op(site, read.statement, edit, []) for site in ctx.sites(w, read.statement)]
        out.repairs.append(ctx.info(ROW_LOCK, w, read.statement, edit.after))
        out.sql.append({"before": edit.before, "after": edit.canonical})
    return out


# -- atomic conditional update ---------------------------------------------------------------------------------
def atomic_update(ctx: Context, w: Writer) -> Outcome:
    """``UPDATE t SET c = c - 1 WHERE k = %s`` → ``... AND c >= 1`` (from the invariant), "no row" handled."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates:
        raise NotApplicable("no in-place UPDATE to guard")
    if not ctx.invariants:
        raise NotApplicable("no invariant configured for the table")
    out = Outcome()
    for write in updates:
        edit = _edit(partial(sql_rewrite.atomic_update, write.statement, ctx.invariants))
        for site in ctx.sites(w, write.statement):
            out.ops.append(_sql_op(site, write.statement, edit, _param_values(site, edit, {})))
            out.ops += _no_row(ctx, site, ATOMIC_UPDATE, "no row if the guard fails")
        out.repairs.append(ctx.info(ATOMIC_UPDATE, w, write.statement, edit.after))
        out.sql.append({"before": edit.before, "after": edit.canonical})
    return out


# -- optimistic version check ----------------------------------------------------------------------------------
def optimistic_version(ctx: Context, w: Writer) -> Outcome:
    """``UPDATE ... WHERE id = %s`` → ``... AND version = %s`` with the version the function read."""
    updates = [a for a in w.writes if a.operation == "write"]
    if not updates:
        raise NotApplicable("no UPDATE to check the version in")
    column = next((c for c in ctx.version_columns if _has_column(w, c)), None)
    if column is None:
        raise NotApplicable("no version column in the statements")
    if not column.isidentifier() or keyword.iskeyword(column):
        raise NotApplicable(f"version column {column!r} is not a Python name")
    out = Outcome()
    for write in updates:
        edit = _edit(partial(sql_rewrite.optimistic, write.statement, column))
        for site in ctx.sites(w, write.statement):
            at = ctx.index.position(site.path, site.call)
            if column not in bound_names(site.func, at, ctx.index, site.path):
                raise NotApplicable(f"no variable {column!r} holds the version read before the UPDATE")
            out.ops.append(_sql_op(site, write.statement, edit, _param_values(site, edit, {"version": column})))
            out.ops += _no_row(ctx, site, OPTIMISTIC_VERSION, "no row if the version changed")
        out.repairs.append(ctx.info(OPTIMISTIC_VERSION, w, write.statement, edit.after))
        out.sql.append({"before": edit.before, "after": edit.canonical})
    return out


def _has_column(w: Writer, column: str) -> bool:
    for access in (*w.writes, *w.reads):
        try:
            tree = sql_rewrite.parse(access.statement)
        except RewriteError:
            continue
        if any(c.name == column for c in tree.find_all(exp.Column)):
            return True
    return False


# -- idempotency guard -----------------------------------------------------------------------------------------
def idempotency_guard(ctx: Context, w: Writer) -> Outcome:
    """An unguarded INSERT gets the request's key and ``ON CONFLICT (key) DO NOTHING``; a repeat gets the first row."""
    inserts = [a for a in w.writes if a.operation == "insert"]
    if not inserts:
        raise NotApplicable("no INSERT to guard")
    column = ctx.idempotency_column
    out = Outcome()
    for insert in inserts:
        edit = _edit(partial(sql_rewrite.idempotency_guard, insert.statement, column))
        existing = sql_rewrite.existing_row_query(insert.statement, column)
        for site in ctx.sites(w, insert.statement):
            key = _key_name(site.func)
            if key is None:
                raise NotApplicable(f"no idempotency key in scope of {site.func.name.value}()")
            values = _param_values(site, edit, {"idempotency_key": key})
            out.ops.append(_sql_op(site, insert.statement, edit, values))
            out.ops += _existing_row(ctx, site, existing, key)
        out.repairs.append(ctx.info(IDEMPOTENCY_GUARD, w, insert.statement, edit.after))
        out.sql.append({"before": edit.before, "after": edit.canonical})
    return out


def _key_name(func: cst.FunctionDef) -> str | None:
    """The parameter that carries the request's idempotency key (``idempotency_key``, ``key``, ...)."""
    names = [p.name.value for p in [*func.params.params, *func.params.kwonly_params]]
    ranked = sorted((n for n in names if _KEY_NAME.fullmatch(n)), key=lambda n: ("idempotency" not in n, n != "key"))
    return ranked[0] if ranked else None


def _existing_row(ctx: Context, site: CallSite, query: str | None, key: str) -> list[Op]:
    """Make a repeated request answer with the row the first one inserted."""
    path, index = site.path, ctx.index
    statement = index.statement_of(path, site.call)
    if statement is None:
        raise NotApplicable("the INSERT is not inside a statement")
    note = "a repeated key inserts nothing"
    if query is None:
        return [lambda p: p.comment(path, statement, f"repair({IDEMPOTENCY_GUARD}): {note}")]
    lookup = cst.Call(
        func=cst.Attribute(value=site.receiver.deep_clone(), attr=cst.Name("execute")),
        args=[
            cst.Arg(string_literal(query), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(cst.Tuple([cst.Element(cst.Name(key), comma=cst.Comma())])),
        ],
    )
    text = f"repair({IDEMPOTENCY_GUARD}): {note}; answer with the row the first request inserted"
    parent = index.parent(path, site.call)
    if isinstance(parent, cst.Attribute) and parent.attr.value == "fetchone":
        fetch = index.parent(path, parent)
        assert isinstance(fetch, cst.Call)
        fetched = cst.Call(func=cst.Attribute(value=lookup, attr=cst.Name("fetchone")))

        where = index.position(path, fetch)
        column = where.start.column + 1 if where is not None else 0
        newline = cst.ParenthesizedWhitespace(indent=False, last_line=cst.SimpleWhitespace(" " * column))

        def either(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.BaseExpression)
            joined = cst.BooleanOperation(left=node, operator=cst.Or(whitespace_before=newline), right=fetched)
            return joined.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

        return [lambda p: p.edit(path, fetch, "existing-row", either), lambda p: p.comment(path, statement, text)]
    target = _assigned_name(index, path, parent)
    if target is None:
        return [lambda p: p.comment(path, statement, f"repair({IDEMPOTENCY_GUARD}): {note}")]
    check = cst.If(
        test=_rowcount_is_zero(cst.Name(target)),
        body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(target))], lookup)])]),
    )
    return [lambda p: p.after(path, statement, "existing-row", check), lambda p: p.comment(path, statement, text)]


# -- stricter isolation ----------------------------------------------------------------------------------------
def stricter_isolation(ctx: Context, w: Writer) -> Outcome:
    """Run the writer's transaction at SERIALIZABLE, retried when PostgreSQL aborts it on a conflict."""
    out = Outcome()
    text = f"repair({STRICTER_ISOLATION}): SERIALIZABLE; a transaction aborted by a conflict is retried"
    for write in w.writes:
        for site in ctx.sites(w, write.statement):
            block = _transaction(ctx.index, site)
            if block is None:
                raise NotApplicable(f"no `with ....transaction():` block around the write in {w.function}")
            setup = _set_serializable(block)
            out.ops.append(_retry_op(site.path, block, setup, text))
        out.repairs.append(ctx.info(STRICTER_ISOLATION, w, write.statement, write.statement))
    out.sql.append(dict(sql_rewrite.SERIALIZABLE_BEGIN))
    return out


def _retry_op(path: Path, block: cst.With, setup: cst.BaseStatement, text: str) -> Op:
    def op(patch: Patch) -> None:
        patch.retry(path, block, setup, text)

    return op


def _transaction(index: SourceIndex, site: CallSite) -> cst.With | None:
    """The ``with x.transaction(...)`` block in the recorded function that runs the statement."""
    node: cst.CSTNode | None = site.chain[0] if site.chain else site.call
    path = site.entry_path
    while node is not None and not isinstance(node, cst.FunctionDef):
        if isinstance(node, cst.With) and any(_is_call_to(i.item, "transaction") for i in node.items):
            return node if isinstance(node.body, cst.IndentedBlock) else None
        node = index.parent(path, node)
    return None


def _is_call_to(node: cst.BaseExpression, method: str) -> bool:
    return isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == method


def _set_serializable(block: cst.With) -> cst.BaseStatement:
    """``cur.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")`` on the block's cursor, else its connection."""
    receiver: cst.BaseExpression | None = None
    for item in block.items:
        if _is_call_to(item.item, "cursor") and item.asname is not None and isinstance(item.asname.name, cst.Name):
            receiver = item.asname.name
            break
    if receiver is None:
        call = next(i.item for i in block.items if _is_call_to(i.item, "transaction"))
        assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
        receiver = call.func.value
    execute: cst.BaseExpression = cst.Call(
        func=cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("execute")),
        args=[cst.Arg(string_literal(_SET_SERIALIZABLE))],
    )
    if block.asynchronous is not None:  # psycopg's AsyncConnection / AsyncCursor
        execute = cst.Await(expression=execute)
    return cst.SimpleStatementLine([cst.Expr(execute)])


# -- "no row updated" ------------------------------------------------------------------------------------------
def _no_row(ctx: Context, site: CallSite, strategy: str, why: str) -> list[Op]:
    """A guarded UPDATE may match no row: reuse the code's missing-row handling, or add it; explain in a comment."""
    path, index = site.path, ctx.index
    statement = index.statement_of(path, site.call)
    if statement is None:
        raise NotApplicable("the UPDATE is not inside a statement")
    head = f"repair({strategy}): {why}"
    parent = index.parent(path, site.call)
    handled: str | None = None
    subject: cst.BaseExpression | None = None
    fetched = False
    if isinstance(parent, cst.Attribute) and parent.attr.value == "fetchone":
        fetch = index.parent(path, parent)
        holder = index.parent(path, fetch) if fetch is not None else None
        if isinstance(holder, cst.Arg):
            call = index.parent(path, holder)
            if isinstance(call, cst.Call) and call.args and call.args[0] is holder:
                handled = _none_checker(index, path, call.func)
        else:
            name = _assigned_name(index, path, holder)
            if name is not None:
                handled = _later_check(index, path, statement, name, fetched=True)
                subject, fetched = cst.Name(name), True
    else:
        name = _assigned_name(index, path, parent)
        if name is not None:
            handled = _later_check(index, path, statement, name, fetched=False)
            subject = cst.Name(name)
        elif isinstance(parent, cst.Expr):
            subject = site.receiver
    if handled is not None:
        text = f"{head}; {handled} already handles the None"
        return [lambda p: p.comment(path, statement, text)]
    if subject is None:
        return [lambda p: p.comment(path, statement, f"{head}; fetchone() then returns None")]
    test = _is_none(subject) if fetched else _rowcount_is_zero(subject)
    check = cst.If(test=test, body=cst.IndentedBlock(_missing_row_handler(index, site)))
    text = f"{head}; handled below like the failed check"
    return [lambda p: p.after(path, statement, "no-row", check), lambda p: p.comment(path, statement, text)]


def _assigned_name(index: SourceIndex, path: Path, node: cst.CSTNode | None) -> str | None:
    if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
        return node.targets[0].target.value
    return None


def _none_checker(index: SourceIndex, path: Path, func: cst.BaseExpression) -> str | None:
    """``name()`` when ``func`` names a local helper that raises or returns when its first argument is None."""
    if not isinstance(func, cst.Name):
        return None
    found = index.local_def(path, func.value)
    if found is None or not found[1].params.params:
        return None
    first = found[1].params.params[0].name.value
    for node in walk(found[1].body):
        if isinstance(node, cst.If) and _tests_none(node.test, first) and _exits(node):
            return f"{func.value}()"
    return None


def _later_check(index: SourceIndex, path: Path, statement: cst.CSTNode, name: str, *, fetched: bool) -> str | None:
    """How the statements after ``statement`` handle ``name`` being no row: a helper, or ``if name is None``."""
    block = index.parent(path, statement)
    body = getattr(block, "body", ())
    if not isinstance(body, Sequence) or statement not in body:
        return None
    for later in body[list(body).index(statement) + 1 :]:
        for node in walk(later):
            if isinstance(node, cst.If) and fetched and _tests_none(node.test, name) and _exits(node):
                return f"the `if {name} is None` check"
            if isinstance(node, cst.Call) and node.args and _refers(node.args[0].value, name, fetched):
                checker = _none_checker(index, path, node.func)
                if checker is not None:
                    return checker
    return None


def _refers(node: cst.BaseExpression, name: str, fetched: bool) -> bool:
    if fetched:
        return isinstance(node, cst.Name) and node.value == name
    return (
        isinstance(node, cst.Call)
        and isinstance(node.func, cst.Attribute)
        and node.func.attr.value == "fetchone"
        and isinstance(node.func.value, cst.Name)
        and node.func.value.value == name
    )


def _tests_none(test: cst.BaseExpression, name: str) -> bool:
    """``name is None`` or ``not name``, exactly."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return isinstance(test.expression, cst.Name) and test.expression.value == name
    return (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and test.left.value == name
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    )


def _exits(node: cst.If) -> bool:
    return any(isinstance(n, cst.Raise | cst.Return) for n in walk(node.body))


def _missing_row_handler(index: SourceIndex, site: CallSite) -> list[cst.BaseStatement]:
    """The body of the check before the statement that ends the request (``raise OutOfStock(...)``), cloned."""
    at = index.position(site.path, site.call)
    best: cst.If | None = None
    for node in walk(site.func.body):
        if not isinstance(node, cst.If) or not isinstance(node.body, cst.IndentedBlock):
            continue
        where = index.position(site.path, node)
        body = node.body.body
        simple = len(body) == 1 and isinstance(body[0], cst.SimpleStatementLine)
        if simple and _exits(node) and where is not None and at is not None and where.start.line < at.start.line:
            best = node
    if best is not None:
        assert isinstance(best.body, cst.IndentedBlock)
        return [s.deep_clone() for s in best.body.body]
    fallback = string_literal("no row matched: a concurrent transaction changed it first")
    raise_ = cst.Raise(exc=cst.Call(func=cst.Name("LookupError"), args=[cst.Arg(fallback)]))
    return [cst.SimpleStatementLine([raise_])]


def _is_none(subject: cst.BaseExpression) -> cst.Comparison:
    return cst.Comparison(subject.deep_clone(), [cst.ComparisonTarget(cst.Is(), cst.Name("None"))])


def _rowcount_is_zero(subject: cst.BaseExpression) -> cst.Comparison:
    rowcount = cst.Attribute(value=subject.deep_clone(), attr=cst.Name("rowcount"))
    return cst.Comparison(rowcount, [cst.ComparisonTarget(cst.Equal(), cst.Integer("0"))])


STRATEGIES: Final[dict[str, Callable[[Context, Writer], Outcome]]] = {
    ROW_LOCK: row_lock,
    ATOMIC_UPDATE: atomic_update,
    OPTIMISTIC_VERSION: optimistic_version,
    STRICTER_ISOLATION: stricter_isolation,
    IDEMPOTENCY_GUARD: idempotency_guard,
}
