"""The daemon's own view of a statement: its table and its lock mode, as ``SqlAccessExtractor`` classifies it."""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from processors.repair.sql_rewrite import RewriteError, parse, placeholders
from processors.sql_access import SqlAccessExtractor
from streamer.events import DbCall, Resource, Span, SpanKind, StatusCode

UNKNOWN = "unknown"


def table_of(statement: str) -> str:
    """The (bare) table a statement reads or writes; "" when it cannot be told."""
    try:
        tree = parse(statement)
    except RewriteError:
        return ""
    table = tree.find(exp.Table)
    return table.name if table is not None else ""


def _span(statement: str, n: int) -> Span:
    db = DbCall(system="postgresql", statement=statement, params=tuple(range(1, n + 1)))
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
