"""Which column each positional parameter of a statement is bound to, read off the statement's shape.

The same analysis the SQL extractor makes (``processors.sql``, sqlglot, cached per statement text): a parameter
compared with a column in the WHERE (``email = $1``, ``id IN (?, ?)``) or set into one (``SET email = %s``,
``INSERT ... VALUES``) is that column's; one inside an expression of a column (``SET stock = stock - $1``) is that
column's too; any other (``lower(email) = $1``, a function's argument) is bound to no known column.
"""

from __future__ import annotations

from collections.abc import Iterable

from processors.api.telemetry import Telemetry
from processors.sql import SqlAccessExtractor
from processors.sql.syntax import Expr, Pos, Ref

CACHE = 1024  # statement shapes kept (bounded; evictions counted by the SQL extractor's telemetry)


class ParameterColumns:
    """Positional parameter index -> column, per statement text."""

    __slots__ = ("_sql",)

    def __init__(self, telemetry: Telemetry | None = None) -> None:
        # No table keys: every statement reads as a predicate access, so its key columns are WHERE terms too.
        self._sql = SqlAccessExtractor(cache_size=CACHE, telemetry=telemetry)

    def of(self, statement: str) -> dict[int, str]:
        """Each bound parameter's column ({} for a statement that does not parse)."""
        if not statement.strip():
            return {}
        shape = self._sql.shape(statement)
        if isinstance(shape, str):
            return {}
        pairs: list[tuple[str, Ref]] = list(shape.set_values)
        for column, _op, ref in shape.predicates:
            pairs += [(column, r) for r in ref] if isinstance(ref, tuple) else [(column, ref)]
        for target in shape.targets:
            pairs += list(target.set_values)
        out: dict[int, str] = {}
        for column, ref in pairs:
            for index in _positions(ref):
                out.setdefault(index, column)
        return out


def _positions(ref: Ref) -> Iterable[int]:
    if isinstance(ref, Pos):
        yield ref.index
    elif isinstance(ref, Expr):
        yield from (r.index for r in ref.refs if isinstance(r, Pos))


__all__ = ["ParameterColumns"]
