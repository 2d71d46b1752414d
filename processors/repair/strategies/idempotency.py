"""The idempotency guard: an unguarded INSERT carries the request's key and ``ON CONFLICT (key) DO NOTHING``.

The key is the function's parameter named like one (``idempotency_key``, ``request_key``, ``key``, ...). A repeated
request then inserts nothing; when the INSERT returns the row (``RETURNING``), the code answers it with the row the
first request inserted (``execute(...).fetchone() or <lookup>``, a lookup when the fetched row is None, or when
``rowcount == 0``).
"""

from __future__ import annotations

import re
from functools import partial
from typing import Final

import libcst as cst

from processors.repair import sql_inserts
from processors.repair.edits import string_literal
from processors.repair.locate import CallSite
from processors.repair.strategies.base import (
    IDEMPOTENCY_GUARD,
    Context,
    NotApplicable,
    Op,
    Outcome,
    Writer,
    param_values,
    rewrite,
    sql_op,
)
from processors.repair.strategies.no_row import assigned_name, rowcount_is_zero

_KEY_NAME: Final = re.compile(r"(?:.*_)?(?:idempotency_key|idem_?key|request_key|key)$")


def idempotency_guard(ctx: Context, w: Writer) -> Outcome:
    """An unguarded INSERT gets the request's key and ``ON CONFLICT (key) DO NOTHING``; a repeat gets the first row."""
    inserts = [a for a in w.writes if a.operation == "insert"]
    if not inserts:
        raise NotApplicable("no INSERT to guard")
    column = ctx.idempotency_column
    out = Outcome()
    for insert in inserts:
        edit = rewrite(partial(sql_inserts.idempotency_guard, insert.statement, column))
        existing = sql_inserts.existing_row_query(insert.statement, column)
        for site in ctx.sites(w, insert.statement):
            key = _key_name(site.func)
            if key is None:
                raise NotApplicable(f"no idempotency key in scope of {site.func.name.value}()")
            values = param_values(site, edit, {"idempotency_key": key})
            out.ops.append(sql_op(site, insert.statement, edit, values))
            out.ops += existing_row(ctx, site, existing, [cst.Name(key)], IDEMPOTENCY_GUARD,
                                    "a repeated key inserts nothing", "the first request inserted")  # fmt: skip
        out.repairs.append(ctx.info(IDEMPOTENCY_GUARD, w, insert.statement, edit.after))
        out.rewrote(edit)
    return out


def _key_name(func: cst.FunctionDef) -> str | None:
    """The parameter that carries the request's idempotency key (``idempotency_key``, ``key``, ...)."""
    names = [p.name.value for p in [*func.params.params, *func.params.kwonly_params]]
    ranked = sorted((n for n in names if _KEY_NAME.fullmatch(n)), key=lambda n: ("idempotency" not in n, n != "key"))
    return ranked[0] if ranked else None


def existing_row(ctx: Context, site: CallSite, query: str | None, args: list[cst.BaseExpression], strategy: str,
                 note: str, first: str) -> list[Op]:  # fmt: skip
    """Make a request whose INSERT did nothing answer with the row ``first`` (described): ``query`` (a SELECT of the
    INSERT's RETURNING columns) with ``args``; a comment only when the INSERT returns nothing."""
    path, index = site.path, ctx.index
    statement = index.statement_of(path, site.call)
    if statement is None:
        raise NotApplicable("the INSERT is not inside a statement")
    if query is None:
        return [lambda p: p.comment(path, statement, f"repair({strategy}): {note}")]
    elements = [cst.Element(a.deep_clone(), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                for a in args[:-1]]  # fmt: skip
    elements.append(
        cst.Element(args[-1].deep_clone(), comma=cst.Comma() if len(args) == 1 else cst.MaybeSentinel.DEFAULT)
    )
    lookup = cst.Call(
        func=cst.Attribute(value=site.receiver.deep_clone(), attr=cst.Name("execute")),
        args=[
            cst.Arg(string_literal(query), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(cst.Tuple(elements)),
        ],
    )
    text = f"repair({strategy}): {note}; answer with the row {first}"
    parent = index.parent(path, site.call)
    if isinstance(parent, cst.Attribute) and parent.attr.value == "fetchone":
        fetch = index.parent(path, parent)
        assert isinstance(fetch, cst.Call)
        fetched = cst.Call(func=cst.Attribute(value=lookup, attr=cst.Name("fetchone")))
        named = assigned_name(index, path, index.parent(path, fetch))
        if named is not None:  # row = cur.execute(INSERT ...).fetchone() → if row is None: row = <lookup>.fetchone()
            none = cst.Comparison(cst.Name(named), [cst.ComparisonTarget(cst.Is(), cst.Name("None"))])
            assign = cst.Assign([cst.AssignTarget(cst.Name(named))], fetched)
            fallback = cst.If(test=none, body=cst.IndentedBlock([cst.SimpleStatementLine([assign])]))
            return [lambda p: p.after(path, statement, "existing-row", fallback),
                    lambda p: p.comment(path, statement, text)]  # fmt: skip

        where = index.position(path, fetch)
        column = where.start.column + 1 if where is not None else 0
        newline = cst.ParenthesizedWhitespace(indent=False, last_line=cst.SimpleWhitespace(" " * column))

        def either(node: cst.CSTNode) -> cst.CSTNode:
            assert isinstance(node, cst.BaseExpression)
            joined = cst.BooleanOperation(left=node, operator=cst.Or(whitespace_before=newline), right=fetched)
            return joined.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])

        return [lambda p: p.edit(path, fetch, "existing-row", either), lambda p: p.comment(path, statement, text)]
    target = assigned_name(index, path, parent)
    if target is None:
        return [lambda p: p.comment(path, statement, f"repair({strategy}): {note}")]
    check = cst.If(
        test=rowcount_is_zero(cst.Name(target)),
        body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(target))], lookup)])]),
    )
    return [lambda p: p.after(path, statement, "existing-row", check), lambda p: p.comment(path, statement, text)]
