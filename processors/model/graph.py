"""What processors ask of the graph: parameter rows per named upsert, and events to record.

The Cypher behind each name lives in one place, the graph sink's schema module (``sinks.graph.schema``);
processors only build rows. Values must already be plain data (see ``processors.graph.rows.clean``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from processors.model.base import Published

Row = dict[str, Any]


@dataclass(slots=True)
class GraphBatch:
    """Rows for each upsert, in dependency order (nodes before the edges that join them)."""

    services: list[Row] = field(default_factory=list)
    operations: list[Row] = field(default_factory=list)
    traces: list[Row] = field(default_factory=list)
    late_traces: list[Row] = field(default_factory=list)  # like traces, but only onto a Trace already in the graph
    spans: list[Row] = field(default_factory=list)
    child_of: list[Row] = field(default_factory=list)
    reads: list[Row] = field(default_factory=list)
    writes: list[Row] = field(default_factory=list)
    predicates: list[Row] = field(default_factory=list)  # statements naming no row by its key, on the table's scope
    windows: list[Row] = field(default_factory=list)
    calls: list[Row] = field(default_factory=list)
    changes: list[Row] = field(default_factory=list)
    stats: list[Row] = field(default_factory=list)
    tallies: list[Row] = field(default_factory=list)  # the proof judge's per-partition contributions
    tables: list[Row] = field(default_factory=list)  # key columns learned from Debezium's message keys
    # Events to record on the graph without publishing them (e.g. the automatic proof contract of an incident).
    records: list[Published] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(getattr(self, name)) for name in UPSERTS) + len(self.records)

    def extend(self, other: GraphBatch) -> None:
        for f in fields(self):
            getattr(self, f.name).extend(getattr(other, f.name))


UPSERTS: tuple[str, ...] = tuple(f.name for f in fields(GraphBatch) if f.name != "records")
