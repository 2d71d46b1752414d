"""What the graph writer writes: parameter rows for batched ``UNWIND $rows ... MERGE`` statements.

Pure functions from closed traces, their database accesses and closed windows to rows, grouped by the
statement that takes them (``GraphBatch``). Every trace feeds services, operations and the CALLS windows; the detail
policy decides which traces become ``Trace``/``Span`` nodes, and which of their spans:

- ``paths`` (the default): traces that touch a row or fail, and of those only what the graph's readers read: the
  access spans (their READ/WROTE/PREDICATE edges), the error spans, and every ancestor of those up to the root
  (with CHILD_OF). The other spans of the trace are one compact property on the Trace node, ``omitted`` (see
  :func:`omitted_text` / :func:`omitted_spans`). The kept spans travel inside their trace's row, one row per trace.
- ``entities_or_errors``: every span of the traces that touch a row or fail, one row per span and per edge.
- ``all``: every span of every trace (tests that count spans, debugging); ``none``: no Trace/Span nodes.

Values pass through :func:`clean` so that what reaches FalkorDB's parameter header is plain data: no bytes, no NaN,
no integers beyond 64 bits. The falkordb client renders parameters into the query text in Python, per value and per
map key, so spans are built as positional lists here (converting maps later costs as much as it saves).
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field
from pydantic_core import PydanticSerializationError, to_json

from processors.api.component import Section
from processors.correlation.engine import Correlation
from processors.lib.json_text import one_shot
from processors.model.events import Access, DbOperation, RowChange, SpanKind, StatusCode
from processors.model.graph import GraphBatch, Row
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.calls import Parts
from processors.sql.values import predicate_text
from processors.state.windows import ClosedWindow

_INT_LIMIT = 2**63 - 1
_ERROR = StatusCode.ERROR


DAY_S = 24 * 3600.0


class GraphPolicyConfig(Section):
    """Which spans become graph nodes (the rest feed aggregates only), and how long each kind of node lives, in event
    time (every label's rule, and why, is in ``sinks.graph.schema``, "retention")."""

    detail: str = Field(
        "paths",
        pattern="^(all|entities_or_errors|paths|none)$",
        description="all spans; every span of traces that touch rows or fail; of those only the access and error "
        "spans and their ancestors, the rest as a compact summary on the Trace (paths, the default); or none",
    )
    span_retention_s: float = Field(
        DAY_S, gt=0, description="raw detail: Span and Trace nodes, and rows (Entity) nothing has touched since, "
        "expire after this"
    )  # fmt: skip
    aggregate_retention_s: float = Field(
        30 * DAY_S, gt=0, description="windows and their CALLS and STATS edges, and services and operations not seen "
        "since, expire after this"
    )  # fmt: skip
    incident_retention_s: float = Field(
        180 * DAY_S, gt=0, description="occurrences, the proof judge's tallies, and an incident with its contracts, "
        "verdicts, repros and repairs once none of them has moved for this long, expire after this"
    )  # fmt: skip
    published_retention_s: float = Field(
        14 * DAY_S, gt=0, description="the record of each published event (how a replay knows it published it) "
        "expires after this: keep it above the input topics' retention.ms"
    )  # fmt: skip

    def retentions_s(self) -> dict[str, float]:
        """Each retention horizon of ``sinks.graph.schema.EXPIRE`` (its rules name them), in seconds."""
        return {"spans": self.span_retention_s, "aggregates": self.aggregate_retention_s,
                "incidents": self.incident_retention_s, "published": self.published_retention_s}  # fmt: skip


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


# Column order of a Span row; the writer sends rows as positional lists in this order (half the header bytes).
SPAN_COLUMNS = (
    "id", "trace", "service", "version", "name", "kind", "start", "end", "status", "route", "http_status",
    "exception", "function", "file", "line", "statement",
)  # fmt: skip
_KIND = {k: k.name.lower() for k in SpanKind}
_STATUS = {c: c.name.lower() for c in StatusCode}


# Column order of a span inside its trace's row under the ``paths`` policy (the trace id is the row's own).
PATH_SPAN_COLUMNS = (
    "id", "parent", "service", "version", "name", "kind", "start", "end", "status", "route", "http_status",
    "exception", "function", "file", "line", "statement",
)  # fmt: skip
# Column order of one omitted span in the Trace's ``omitted`` property (JSON: a list of these lists).
OMITTED_COLUMNS = ("name", "service", "offset_ms", "duration_ms", "status")


def paths(trace: ClosedTrace, accesses: Sequence[Access]) -> tuple[list[Span], list[Span]]:
    """(kept, omitted): the access spans and error spans with every ancestor up to the root, and the rest."""
    facts = trace.facts
    by_id = facts.by_id
    spans = trace.spans
    if facts.unique and not facts.error and not facts.exception:
        # No span failed (the facts tell without a look at each span's detail): the walks start at the access
        # spans alone. With unique ids the kept set is the union of their ancestor chains, whatever the order (a
        # span with two accesses starts a second walk, which stops at once).
        starts = [by_id[a.span_id] for a in accesses if a.span_id in by_id]
    else:
        wanted = {a.span_id for a in accesses}
        starts = [s for s in spans if s.span_id in wanted or s.status == _ERROR or s.exception_type]
    keep: set[str] = set()
    for s in starts:
        node: Span | None = s
        while node is not None and node.span_id not in keep:
            keep.add(node.span_id)
            node = by_id.get(node.parent_id)
    if len(keep) == len(spans) and facts.unique:
        return list(spans), []
    return [s for s in spans if s.span_id in keep], [s for s in spans if s.span_id not in keep]


def omitted_text(spans: Sequence[Span], start_ns: int) -> str | None:
    """The compact property of the spans a trace's detail leaves out: JSON, one list per span in start order, of
    :data:`OMITTED_COLUMNS` (offset from the trace start and duration in ms); None when nothing is left out."""
    if not spans:
        return None
    status = _STATUS
    rows = []
    for s in sorted(spans, key=_START):
        begin = s.start_ns
        rows.append([s.name, s.resource.service, _ms3(begin - start_ns), _ms3(s.end_ns - begin), status[s.status]])
    return _compact(rows)


_EXACT_NS = 10**15  # below this, a nanosecond count over 1e6 is far enough from a rounding tie for ``_ms3``


def _ms3(ns: int) -> float:
    """``round(ns / 1e6, 3)``, the same float, in integer arithmetic (cheaper than ``round``; it runs twice per
    omitted span). Off an exact half microsecond, the float ``ns / 1e6`` is nearer to ``ns / 1e6`` than to any
    rounding boundary, so both round to the same microsecond ``q``, and ``q / 1000`` is the float nearest to it,
    as ``round`` returns. Halves (``round`` goes by the float's side of the tie), negatives (``-0.0``) and huge
    values take ``round`` itself."""
    if 0 <= ns < _EXACT_NS and ns % 1000 != 500:
        return (ns + 500) // 1000 / 1000
    return round(ns / 1e6, 3)


_START = operator.attrgetter("start_ns")
# ``json.dumps(rows, separators=(",", ":"), ensure_ascii=False)`` without a new encoder per trace
_json_compact = one_shot(json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False))


def _compact(rows: list[list[Any]]) -> str:
    """``_json_compact(rows)``, the same text written by pydantic-core (faster; its floats are spelt as ``repr``
    spells them but below 1e-4, and these have three decimals), by json's encoder when pydantic-core refuses a
    string (a lone surrogate)."""
    try:
        return to_json(rows).decode()
    except PydanticSerializationError:
        return _json_compact(rows)


def omitted_spans(text: str | None) -> list[dict[str, Any]]:
    """The Trace's ``omitted`` property read back: one dict of :data:`OMITTED_COLUMNS` per omitted span."""
    if not text:
        return []
    return [dict(zip(OMITTED_COLUMNS, row, strict=True)) for row in json.loads(text)]


def detailed(trace: ClosedTrace, accesses: Sequence[Access], policy: str) -> bool:
    if policy == "all":
        return True
    if policy == "none":
        return False  # "entities_or_errors" and "paths" both keep traces that touch rows or fail
    return bool(accesses) or trace.facts.error


def _ms(ns: int) -> float:
    return ns / 1e6


def operation_key(span: Span) -> str:
    return f"{span.resource.service}:{span.route or span.name}"


def _unique(rows: list[Row], field: str, new: dict[str, Row]) -> None:
    """Append the rows of ``new`` (by ``field``) that ``rows`` does not hold yet: one row per name per batch."""
    if new:
        known = {r[field] for r in rows}
        rows.extend(row for k, row in new.items() if k not in known)


def trace_rows(trace: ClosedTrace, accesses: Sequence[Access], policy: str, batch: GraphBatch) -> None:
    """Add one closed trace's rows to ``batch``: always its services and operations, detail if the policy says."""
    facts = trace.facts
    end_ns = trace.end_ns  # (the property: a trace without spans has none)
    seen = end_ns / 1e6  # when they were last seen: retention deletes services and operations no longer seen
    # One row per name per batch (as ``_unique``), made only if new: nearly always every name is known already,
    # so the names the batch holds are read only when the trace's own set of them is not empty of new ones.
    names = {s.resource.service for s in trace.spans}
    if new := names.difference([r["name"] for r in batch.services]):
        batch.services += [{"name": n, "seen": seen} for n in sorted(new)]
    requests = facts.requests  # the server spans and the spans without a parent
    if requests:
        known = {r["key"] for r in batch.operations}
        for span in requests:
            service, name = span.resource.service, span.route or span.name
            if (key := f"{service}:{name}") not in known:
                known.add(key)
                batch.operations.append({"key": key, "service": service, "name": name, "seen": seen})
    # A late fragment of a trace the policy would not detail (typically its root span, exported after the trace
    # closed) still completes the trace if an earlier fragment was detailed: its spans go to ``late_traces``,
    # which writes only onto a Trace already in the graph, so that the earlier spans get their parents.
    detail = detailed(trace, accesses, policy)
    completing = policy == "paths" and trace.late and not detail
    if not completing and not detail:
        return
    root, start_ns = trace.root, facts.start_ns  # (the trace has spans: it has an end)
    row: Row = {
        "id": trace.trace_id,
        "root": root.route or root.name,
        "service": root.resource.service,
        "start": start_ns / 1e6,  # (``_ms``, spelt out in the loops over every trace and access)
        "duration_ms": (end_ns - start_ns) / 1e6,
        "status": "error" if facts.error else "ok",
        "version": root.resource.version,
        # Whether this part of the trace has its root span: a late fragment (spans arriving after the trace
        # closed) must not replace the root, start and duration the complete trace wrote.
        "rooted": not root.parent_id,
        "end": seen,
    }
    (batch.late_traces if completing else batch.traces).append(row)
    if policy == "paths":
        kept, omitted = (list(trace.spans), []) if completing else paths(trace, accesses)
        row["omitted"] = omitted_text(omitted, start_ns)
        row["spans"] = _path_spans(kept)
    else:
        for s in trace.spans:
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
            if s.parent_id:  # in this fragment or not: the graph links it now or once the parent is written
                batch.child_of.append({"id": s.span_id, "parent": s.parent_id})
    access_rows(accesses, batch)


def _path_spans(spans: Iterable[Span]) -> list[list[Any]]:
    """The kept spans inside their trace's row, each in :data:`PATH_SPAN_COLUMNS` order (one loop, not a call per
    span: a detailed trace keeps about ten)."""
    kinds, statuses = _KIND, _STATUS
    rows = []
    for s in spans:
        d = s.detail
        r, db = s.resource, d.db
        rows.append(
            [
                s.span_id,
                s.parent_id or None,
                r.service,
                r.version,
                s.name,
                kinds[s.kind],
                s.start_ns / 1e6,
                s.end_ns / 1e6,
                statuses[s.status],
                d.route,
                d.http_status,
                d.exception_type,
                d.code_function,
                d.code_file,
                d.code_line,
                db.statement if db else "",
            ]
        )
    return rows


def access_rows(accesses: Iterable[Access], batch: GraphBatch) -> None:
    """One row per access: its edge from the span, and the Entity it names (the statement MERGEs the Entity)."""
    for a in accesses:
        row = {
            "span": a.span_id,
            "entity": a.entity if type(a.entity) is str else clean(a.entity),  # (``clean`` of a str: the str)
            "table": a.table,
            "at": a.start_ns / 1e6,
            "lock": str(a.lock),  # (a StrEnum's str is its value, made in C: ``.value`` is a Python descriptor)
            "version": a.read_version if type(a.read_version) is str else clean(a.read_version),
            "op": str(a.operation),
            "params": [v if type(v) is str else clean(v) for v in a.params],
            "function": a.function,  # the code site, so that repairs can find every writer of a table
            "file": a.file,
            "predicate": "" if a.keyed else predicate_text(a.predicates, a.exact, a.where),  # of a predicate access
            "keying": a.keying,  # how its row was found (``Access.keying``): bound, by_change, by_trace, predicate
        }
        if not a.keyed:  # the row(s) it wrote get their WROTE edge when Debezium's change is credited to it
            batch.predicates.append(row)
        else:
            (batch.reads if a.operation == DbOperation.READ else batch.writes).append(row)


def window_rows(window: ClosedWindow[Parts], batch: GraphBatch) -> None:
    """One row per (caller, callee, input partition): the graph keeps each contribution and sums them (the window's
    end is on each: retention deletes them by it)."""
    end = _ms(window.end_ns)
    batch.windows.append({"id": window.window_id, "start": _ms(window.start_ns), "end": end})
    services: dict[str, Row] = {}
    for part, calls in sorted(window.value.items()):
        for (caller, callee), stats in sorted(calls.items()):
            services.setdefault(caller, {"name": caller, "seen": end})
            services.setdefault(callee, {"name": callee, "seen": end})
            batch.calls.append(
                {
                    "caller": caller,
                    "callee": callee,
                    "window": window.window_id,
                    "end": end,
                    "part": part,
                    "count": stats.count,
                    "errors": stats.errors,
                    **stats.latency.to_row(),
                }
            )
    _unique(batch.services, "name", services)


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
