"""What the graph writer writes: parameter rows for batched ``UNWIND $rows ... MERGE`` statements.

Pure functions from closed traces, their database accesses and closed windows to row dicts, grouped by the
statement that takes them (``GraphBatch``). The detail policy decides which traces become ``Trace``/``Span``
nodes: ``all``, ``entities_or_errors`` (traces that touch a row or fail; the default), or ``none``; every trace
feeds the aggregates either way. Values pass through :func:`clean` so that what reaches FalkorDB's parameter
header is plain data: no bytes, no NaN, no integers beyond 64 bits.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from processors.correlation import Correlation
from processors.traces import ClosedTrace
from processors.windows import ClosedWindow
from streamer.events import Access, DbOperation, RowChange, Span, SpanKind, StatusCode

Row = dict[str, Any]
_INT_LIMIT = 2**63 - 1


def clean(value: Any) -> Any:
    """A value safe for FalkorDB's parameter header: JSON-like scalars and lists of them."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value if -_INT_LIMIT <= value <= _INT_LIMIT else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes | bytearray):
        return value.hex()
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


@dataclass(slots=True)
class GraphBatch:
    """Rows for each graph statement, in dependency order (nodes before the edges that join them)."""

    services: list[Row] = field(default_factory=list)
    operations: list[Row] = field(default_factory=list)
    traces: list[Row] = field(default_factory=list)
    spans: list[Row] = field(default_factory=list)
    child_of: list[Row] = field(default_factory=list)
    entities: list[Row] = field(default_factory=list)
    reads: list[Row] = field(default_factory=list)
    writes: list[Row] = field(default_factory=list)
    windows: list[Row] = field(default_factory=list)
    calls: list[Row] = field(default_factory=list)
    changes: list[Row] = field(default_factory=list)
    # Statements owned by other processors (stats, regressions, contracts, verdicts): (cypher, rows), written last.
    extra: list[tuple[str, list[Row]]] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(getattr(self, name)) for name in self.__slots__ if name != "extra") + sum(
            len(rows) for _, rows in self.extra
        )

    def extend(self, other: GraphBatch) -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))


# Column order of a Span row; the writer sends rows as positional lists in this order (half the header bytes).
SPAN_COLUMNS = (
    "id", "trace", "service", "version", "name", "kind", "start", "end", "status", "route", "http_status",
    "exception", "function", "file", "line", "statement",
)  # fmt: skip
_KIND = {k: k.name.lower() for k in SpanKind}
_STATUS = {c: c.name.lower() for c in StatusCode}


def _paths(trace: ClosedTrace) -> list[Span]:
    """The spans worth a node under the ``paths`` policy: DB and failed spans, and every ancestor up to the root."""
    by_id = {s.span_id: s for s in trace.spans}
    keep: dict[str, Span] = {}
    for s in trace.spans:
        if s.db is None and not s.is_error and not s.exception_type:
            continue
        node: Span | None = s
        while node is not None and node.span_id not in keep:
            keep[node.span_id] = node
            node = by_id.get(node.parent_id)
    return [s for s in trace.spans if s.span_id in keep]


def detailed(trace: ClosedTrace, accesses: Sequence[Access], policy: str) -> bool:
    if policy == "all":
        return True
    if policy == "none":
        return False  # "entities_or_errors" and "paths" both keep traces that touch rows or fail
    return bool(accesses) or any(s.status == StatusCode.ERROR for s in trace.spans)


def _ms(ns: int) -> float:
    return ns / 1e6


def operation_key(span: Span) -> str:
    return f"{span.resource.service}:{span.route or span.name}"


def trace_rows(trace: ClosedTrace, accesses: Sequence[Access], policy: str, batch: GraphBatch) -> None:
    """Add one closed trace's rows to ``batch``: always its services and operations, detail if the policy says."""
    services = {s.resource.service for s in trace.spans}
    batch.services.extend({"name": name} for name in sorted(services))
    for span in trace.spans:
        if span.kind == SpanKind.SERVER or not span.parent_id:
            batch.operations.append(
                {"key": operation_key(span), "service": span.resource.service, "name": span.route or span.name}
            )
    if not detailed(trace, accesses, policy):
        return
    root = trace.root
    batch.traces.append(
        {
            "id": trace.trace_id,
            "root": root.route or root.name,
            "service": root.resource.service,
            "start": _ms(trace.start_ns),
            "duration_ms": _ms(trace.end_ns - trace.start_ns),
            "status": "error" if any(s.is_error for s in trace.spans) else "ok",
            "version": root.resource.version,
        }
    )
    kept = trace.spans if policy != "paths" else _paths(trace)
    ids = {s.span_id for s in kept}
    for s in kept:
        batch.spans.append(
            {
                "id": s.span_id,
                "trace": s.trace_id,
                "service": s.resource.service,
                "version": s.resource.version,
                "name": s.name,
                "kind": _KIND[s.kind],
                "start": _ms(s.start_ns),
                "end": _ms(s.end_ns),
                "status": _STATUS[s.status],
                "route": s.route,
                "http_status": s.http_status,
                "exception": s.exception_type,
                "function": s.code_function,
                "file": s.code_file,
                "line": s.code_line,
                "statement": s.db.statement if s.db else "",
            }
        )
        if s.parent_id in ids:
            batch.child_of.append({"id": s.span_id, "parent": s.parent_id})
    access_rows(accesses, batch)


def access_rows(accesses: Iterable[Access], batch: GraphBatch) -> None:
    seen: set[str] = set()
    for a in accesses:
        if a.entity not in seen:
            seen.add(a.entity)
            batch.entities.append({"key": clean(a.entity), "table": a.table})
        row = {
            "span": a.span_id,
            "entity": clean(a.entity),
            "at": _ms(a.start_ns),
            "lock": a.lock.value,
            "version": clean(a.read_version),
            "op": a.operation.value,
            "params": clean(list(a.params)),
            "function": a.function,  # the code site, so that repairs can find every writer of a table
            "file": a.file,
        }
        (batch.reads if a.operation == DbOperation.READ else batch.writes).append(row)


def window_rows(window: ClosedWindow, batch: GraphBatch) -> None:
    batch.windows.append({"id": window.window_id, "start": _ms(window.start_ns), "end": _ms(window.end_ns)})
    for (caller, callee), stats in sorted(window.calls.items()):
        batch.services.extend(({"name": caller}, {"name": callee}))
        batch.calls.append(
            {
                "caller": caller,
                "callee": callee,
                "window": window.window_id,
                "count": stats.count,
                "errors": stats.errors,
                "p50_ms": round(stats.latency.quantile(0.5), 3),
                "p95_ms": round(stats.latency.quantile(0.95), 3),
            }
        )


def change_row(change: RowChange, entity: str, correlation: Correlation | None) -> Row:
    """A committed row change: the entity's latest image and, when correlated, the WROTE edge's commit facts."""
    return {
        "entity": clean(entity),
        "table": change.table.rsplit(".", 1)[-1],
        "lsn": change.lsn,
        "tx": change.tx_id,
        "commit_ms": float(change.commit_ts_ms),
        "op": change.op.value,
        "before": clean(change.before) if change.before is not None else None,
        "after": clean(change.after) if change.after is not None else None,
        "span": correlation.access.span_id if correlation else None,
        "strength": correlation.strength if correlation else "none",
        "skew_ms": round(correlation.skew_ms, 3) if correlation else None,
    }
