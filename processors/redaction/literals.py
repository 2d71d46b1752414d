"""Literal values written into a statement's text (``WHERE email = 'a@b.c'``, ``VALUES ('4111...')``), found by
the column they are compared with, set into or inserted into, so that a redacted column's literals can be replaced
in the text as it is (its placeholders, spacing and case untouched: a repro replays the text)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from processors.redaction.policy import Policy, is_marker
from processors.sql import psycopg_to_qmark

MAX_STATEMENTS = 4096  # statement texts whose redacted form is kept
_COMPARE = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.ILike, exp.In)


def _literals(tree: exp.Expression) -> Iterator[tuple[str, Any]]:
    """(column, value) of each literal compared with or written into a named column."""
    for literal in tree.find_all(exp.Literal):
        node: exp.Expression = literal
        parent = node.parent
        if isinstance(parent, exp.Neg):
            node, parent = parent, parent.parent  # a negative number is the literal
        if isinstance(parent, _COMPARE):
            other = parent.this if parent.this is not node else parent.expression
            column = (
                other
                if isinstance(other, exp.Column)
                else other.find(exp.Column)
                if isinstance(other, exp.Func)
                else None
            )
            if isinstance(column, exp.Column):  # lower(email) = 'a@b.c' is email's too
                yield column.name, _value(node)
        elif isinstance(parent, exp.Tuple) and isinstance(parent.parent, exp.Values):
            insert = parent.find_ancestor(exp.Insert)
            schema = insert.this if insert is not None else None
            if isinstance(schema, exp.Schema):
                names = [c.name for c in schema.expressions]
                index = parent.expressions.index(node)
                if index < len(names):
                    yield names[index], _value(node)


def _value(node: exp.Expression) -> Any:
    if isinstance(node, exp.Neg):
        return f"-{node.this.this}"
    assert isinstance(node, exp.Literal)
    return node.this if node.is_string else str(node.this)


def _table(tree: exp.Expression) -> str:
    table = tree.find(exp.Table)
    return table.name if table is not None else ""


class Literals:
    """:func:`redact_literals` cached per statement text (bounded: past ``MAX_STATEMENTS`` it starts over, counted
    as the drop ``max_statements``), since every span of a stage passes here."""

    __slots__ = ("_cache", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._cache: dict[tuple[str, str], str] = {}
        policy.telemetry.declare("max_statements")

    def __call__(self, statement: str, table: str = "") -> str:
        if not statement or not self.policy.enabled:
            return statement
        found = self._cache.get((statement, table))
        if found is None:
            found = redact_literals(statement, self.policy, table)
            if len(self._cache) >= MAX_STATEMENTS:
                self._cache.clear()
                self.policy.telemetry.drop("max_statements")
            self._cache[(statement, table)] = found
        return found


def redact_literals(statement: str, policy: Policy, table: str = "") -> str:
    """``statement`` with the literals of every redacted column replaced by their markers (as SQL strings); a
    statement sqlglot cannot read is returned as it is (the daemon could not read a row or value from it either)."""
    if "'" not in statement and not any(ch.isdigit() for ch in statement):
        return statement
    try:
        tree = sqlglot.parse_one(psycopg_to_qmark(statement), dialect="postgres")
    except (SqlglotError, ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
        return statement
    if not isinstance(tree, exp.Expression):
        return statement
    table = _table(tree) or table
    for column, value in _literals(tree):
        action = policy.action(table, column)
        if action == "keep" or is_marker(value):
            continue
        marker = policy.apply(action, value)
        quoted = "'" + str(value).replace("'", "''") + "'"
        if quoted in statement:
            statement = statement.replace(quoted, f"'{marker}'")
        else:
            statement = re.sub(rf"(?<![\w.'-]){re.escape(str(value))}(?![\w.'])", f"'{marker}'", statement)
    return statement


__all__ = ["Literals", "redact_literals"]
