"""The daemon's own view of a statement: its table and its lock mode, as ``SqlAccessExtractor`` classifies it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlglot import exp

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.repair.sql_edit import RewriteError, parse, placeholders
from processors.sql import SqlAccessExtractor
from processors.sql.values import covers

UNKNOWN = "unknown"


def table_of(statement: str) -> str:
    """The (bare) table a statement reads or writes; "" when it cannot be told."""
    try:
        tree = parse(statement)
    except RewriteError:
        return ""
    table = tree.find(exp.Table)
    return table.name if table is not None else ""


def relative_only(statement: str) -> bool:
    """Whether ``statement`` is an UPDATE that sets every column from its own current value (``x = x + %s``): at
    READ COMMITTED it is applied to the newest row version, so it keeps a concurrent change and never loses one."""
    try:
        tree = parse(statement)
    except RewriteError:
        return False
    if not isinstance(tree, exp.Update) or not tree.expressions:
        return False
    for assignment in tree.expressions:
        if not isinstance(assignment, exp.EQ) or not isinstance(assignment.this, exp.Column):
            return False
        column = assignment.this.name
        if not any(c.name == column for c in assignment.expression.find_all(exp.Column)):
            return False
    return True


def _span(statement: str, n: int, params: Sequence[Any] | None = None) -> Span:
    values = tuple(params) if params is not None else tuple(range(1, n + 1))
    db = DbCall(system="postgresql", statement=statement, params=values)
    return Span(
        trace_id="0" * 32,
        span_id="0" * 16,
        parent_id="",
        name="repair",
        kind=SpanKind.CLIENT,
        start_ns=0,
        end_ns=0,
        status=StatusCode.UNSET,
        resource=Resource(service="repair"),
        db=db,
    )


def _inferred(statement: str, version_columns: Sequence[str]) -> SqlAccessExtractor:
    """An extractor keyed on the statement's ``id = ?`` or first other ``col = ?`` (or its insert columns)."""
    tree = parse(statement)
    table = table_of(statement)
    keys: dict[str, list[str]] = {}
    identity: dict[str, list[str]] = {}
    if isinstance(tree, exp.Insert) and isinstance(tree.this, exp.Schema):
        identity[table] = [c.name for c in tree.this.expressions]
    else:
        where = tree.args.get("where")
        found = where.find_all(exp.EQ, bfs=False) if where is not None else iter(())
        columns = [e.this.name for e in found if isinstance(e.this, exp.Column) and e.this.name not in version_columns]
        if columns:
            keys[table] = ["id"] if "id" in columns else columns[:1]
    return SqlAccessExtractor(key_columns=keys, insert_identity=identity, version_columns=version_columns)


def lock_of(
    statement: str, extractor: SqlAccessExtractor | None = None, version_columns: Sequence[str] = ("version",)
) -> str:
    """The lock mode the daemon gives ``statement`` (``none``, ``for_update``, ``atomic``, ...), or ``unknown``."""
    try:
        span = _span(statement, placeholders(statement))
        candidates = [extractor] if extractor is not None else []
        candidates.append(_inferred(statement, version_columns))
    except RewriteError:
        return UNKNOWN
    for candidate in candidates:
        found = candidate.accesses(span)
        if found:
            return found[0].lock.value
    return UNKNOWN


def selects(statement: str, params: Sequence[Any], image: Mapping[str, Any] | None) -> bool | None:
    """Whether ``statement`` with ``params`` selects the row ``image`` (its whole WHERE evaluated on the image, as
    the daemon evaluates a predicate); None when that cannot be told."""
    try:
        span = _span(statement, placeholders(statement), params)
    except RewriteError:
        return None
    found = SqlAccessExtractor().accesses(span)  # no key columns: every WHERE term is kept as a predicate
    if len(found) != 1 or found[0].operation.value != "read":
        return None
    return covers(found[0].predicates, found[0].exact, image, found[0].where)
