"""Parameters a statement was sent with but telemetry did not record, read back off the incident's row images.

The stock ORM instrumentations (SQLAlchemy's, Django's) report the statement text and no parameters, so a repro
cannot replay it as recorded. What each placeholder held is in the rows its session changed: the value a column is
set to (``SET balance = %s``, an INSERT's ``VALUES``) is the column's after-image in that session's committed change;
the value a column is compared with (``WHERE account_no = %s``) is the column's value in the row the session changed,
before the change (after it, for a row it inserted). A placeholder the select list only echoes back (Django's
``SELECT %s AS "a"`` of ``exists()``) changes no row read or written and is bound to NULL. Any other placeholder
(``balance + %s``: the amount is in no image) has no recorded value, and the statement is refused with that reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from processors.model.outputs import AccessInfo, CommitInfo
from processors.repro.statements import ReproError, numbered


def _role(node: exp.Expression) -> tuple[str, str]:
    """("set" | "where" | "echo", column) of the placeholder ``node``; ("", "") when it is none of them."""
    while isinstance(node.parent, exp.Cast | exp.Paren):
        node = node.parent
    parent = node.parent
    if isinstance(parent, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        other = parent.this if parent.expression is node else parent.expression
        if isinstance(other, exp.Column):
            in_set = isinstance(parent.parent, exp.Update) and parent.arg_key == "expressions"
            return ("set" if in_set else "where"), other.name
    if isinstance(parent, exp.Tuple) and isinstance(parent.parent, exp.Values):
        insert = parent.parent.parent
        if isinstance(insert, exp.Insert) and isinstance(insert.this, exp.Schema):
            columns = [c.name for c in insert.this.expressions]
            position = parent.expressions.index(node)
            if position < len(columns):
                return "set", columns[position]
    if isinstance(parent, exp.Alias) and isinstance(parent.parent, exp.Select) and parent.arg_key == "expressions":
        return "echo", ""
    return "", ""


def _value(role: str, column: str, changes: Sequence[CommitInfo]) -> tuple[bool, Any]:
    for change in changes:
        image = change.after if role == "set" or change.before is None else change.before
        if image is not None and column in image:
            return True, image[column]
    return False, None


def recovered(access: AccessInfo, commits: Sequence[CommitInfo]) -> list[Any]:
    """``access``'s parameters, in placeholder order: the recorded ones, else those its session's row changes
    show; raises ReproError naming the first placeholder no image holds."""
    text, count = numbered(access.statement)
    if access.params or count == 0:
        return list(access.params)
    try:
        tree = sqlglot.parse_one(text, dialect="postgres")
    except (SqlglotError, ValueError, RecursionError) as exc:
        raise ReproError(f"statement does not parse: {exc}") from None
    changes = sorted((c for c in commits if c.trace_id == access.trace_id), key=lambda c: c.lsn)
    found: dict[int, Any] = {}
    for node in tree.find_all(exp.Parameter):
        if not (isinstance(node.this, exp.Literal) and node.this.name.isdigit()):
            continue
        role, column = _role(node)
        ok, value = (True, None) if role == "echo" else _value(role, column, changes) if role else (False, None)
        if not ok:
            where = f"on {column}" if column else "outside a column comparison or assignment"
            raise ReproError(f"no parameters recorded, and no row image of its session holds the placeholder {where}")
        found[int(node.this.name)] = value
    if sorted(found) != list(range(1, count + 1)):
        raise ReproError(f"{count} placeholders but {len(found)} found in the statement's tree")
    return [found[k] for k in range(1, count + 1)]


__all__ = ["recovered"]
