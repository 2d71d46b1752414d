"""Which columns name a row of each table: learned from Debezium's message keys, overridden by ``sql.key_columns``.

Debezium keys every change message by the table's primary key (or its replica identity), so the key columns of a
table are known as soon as one change of it is seen, whatever they are called. Stage 1 learns them from the row
changes passing through it, writes what it learned to the graph (``Table`` nodes) and loads what other instances
and earlier runs learned, so a restart knows them before the table is written again. A statement on a table whose
key is not known (yet) is kept as a predicate access, never dropped.

Bounded: ``max_tables`` tables (least recently used go, counted as ``max_tables`` drops).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from processors.api.telemetry import Telemetry
from processors.model.events import RowChange
from processors.state.lru import CountedLRU


def bare(table: str) -> str:
    """``public.orders`` → ``orders`` (Debezium names tables with their schema; statements often do not)."""
    return table.rsplit(".", 1)[-1]


class TableKeys:
    """Key columns per table: configured ones win, else those Debezium's message keys carried."""

    def __init__(self, configured: Mapping[str, Sequence[str]] | None = None, *, max_tables: int = 10_000,
                 telemetry: Telemetry | None = None) -> None:  # fmt: skip
        self._configured = {k: tuple(v) for k, v in (configured or {}).items() if v}
        self.telemetry = telemetry or Telemetry("sql")
        self._learned: CountedLRU[str, tuple[str, ...]] = CountedLRU(max(1, max_tables), self.telemetry, "max_tables")
        self._fresh: dict[str, tuple[str, ...]] = {}  # learned and not handed out by fresh() yet
        self.version = 0  # bumped whenever a table's key changes (cached statement shapes depend on it)

    def columns(self, table: str, schema: str = "") -> tuple[str, ...]:
        """The key columns of ``table`` (``schema.table`` first when a schema is given); () when unknown."""
        if schema and (found := self._configured.get(f"{schema}.{table}")):
            return found
        if found := self._configured.get(table):
            return found
        return self._learned.peek(table) or ()

    def learn(self, change: RowChange) -> bool:
        """Remember the key columns a row change carries; True when they are new or changed for its table."""
        columns = tuple(name for name, _ in change.key)
        return bool(columns) and self._remember(bare(change.table), columns, fresh=True)

    def load(self, stored: Iterable[tuple[str, Sequence[str]]]) -> None:
        """Keys read back from the graph (other instances', earlier runs')."""
        for table, columns in stored:
            if columns and self._learned.peek(table) is None:
                self._remember(table, tuple(columns), fresh=False)

    def _remember(self, table: str, columns: tuple[str, ...], *, fresh: bool) -> bool:
        if self._learned.get(table) == columns:
            return False
        self._learned.put(table, columns)
        self.version += 1
        self.telemetry.count("keys_learned")
        if fresh:
            self._fresh[table] = columns
        return True

    def fresh(self) -> dict[str, tuple[str, ...]]:
        """Keys learned since the last call (to write to the graph)."""
        out, self._fresh = self._fresh, {}
        return out

    def __len__(self) -> int:
        return len(self._learned)


__all__ = ["TableKeys", "bare"]
