"""A batch's rows as the writer sends them, and what becomes of a row the graph will not take as it is.

- :func:`rows_for`: the rows of one upsert of a :class:`GraphBatch` (positional where a map per row would repeat
  every key in the parameter header; a windowed contribution with its :func:`stamp`).
- :func:`split`: a row too big for one statement that can be written in parts: a trace's kept spans in two halves
  (each half merges the same Trace; a span whose parent went in the other half waits for it and is adopted).
- :func:`trimmed`: the row with every text longer than a limit cut there and marked, for a row that is still too
  big alone (the writer halves the limit until the server takes it).
- :class:`DeadRow`: a row refused for its content, as the runtime dead-letters it (the sinks are independent of
  each other, so the graph sink hands it over rather than producing it itself).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processors.graph.rows import PATH_SPAN_COLUMNS, SPAN_COLUMNS
from processors.model.graph import GraphBatch, Row
from sinks.graph.schema import TRACE_COLUMNS

DEAD_REASON = "graph_row_refused"
TRIM_FLOOR = 256  # characters a trimmed text keeps at least: below that, size is not why the row is refused
_COLUMNS: dict[str, tuple[str, ...]] = {"traces": TRACE_COLUMNS, "late_traces": TRACE_COLUMNS, "spans": SPAN_COLUMNS,
                                        "child_of": ("id", "parent"), "adopt": ("trace",)}  # fmt: skip
_SPANS = TRACE_COLUMNS.index("spans")
# A span's detail columns whose empty value ("" or 0: no such attribute) is sent as null, so the node has no such
# property (a CREATE stores no null property, a SET of null removes it): most spans carry none of them, and each
# property stored costs FalkorDB CPU per span (bench/RESULTS.md, issue 37). Every reader of these properties treats
# a missing one as the empty value (``analytics.PARTIES``' ``<> ''``, ``TIMELINE``'s statement, ``TABLE_SITES``).
BARE = ("route", "http_status", "exception", "function", "file", "line", "statement")
_AT = PATH_SPAN_COLUMNS.index("route")  # the details are a span's last columns, in both forms (checked here)
if not PATH_SPAN_COLUMNS[_AT:] == SPAN_COLUMNS[_AT:] == BARE:
    raise ImportError("sinks.graph.rows.bare takes a span's details as its last columns, in BARE's order")


def stamp(row: Mapping[str, Any]) -> str:
    """A windowed contribution's identity and content (its partition and a hash of every value): the totals are
    written only while every contribution they summed still has the stamp they read."""
    digest = hashlib.blake2b(json.dumps(row, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()
    return f"{row.get('part', '')}:{digest}"


def bare(s: list[Any]) -> list[Any]:
    """A positional span (either form) with its empty details (:data:`BARE`) as null: a new list, spelt out (it runs
    for every kept span, and a loop over the columns cost the daemon several times as much: bench/RESULTS.md)."""
    return [*s[:_AT], s[_AT] or None, s[_AT + 1] or None, s[_AT + 2] or None, s[_AT + 3] or None,
            s[_AT + 4] or None, s[_AT + 5] or None, s[_AT + 6] or None]  # fmt: skip


def _spans(spans: Any, empty: bool) -> Any:
    return spans if empty or not spans else [bare(p) for p in spans]


def rows_for(batch: GraphBatch, name: str, *, empty: bool = False) -> list[Any]:
    """The rows of upsert ``name`` of ``batch`` as the writer sends them (a span's empty details as null, unless
    ``empty``: the bench's form before that change). A trace row's kept spans are the batch's own lists: the
    statement that writes the row puts them in its form (:func:`linked` or :func:`sent`), so that a span is copied
    once, not once for its empty details and again for its parent's place."""
    rows: list[Row] = getattr(batch, name)
    if name in ("traces", "late_traces"):  # positional; the kept spans are the batch's, put in form by trace_writes
        return [[r["id"], r["root"], r["service"], r["start"], r["end"], r["status"], r["version"], r["rooted"],
                 r.get("omitted"), r.get("spans", [])]
                for r in rows]  # fmt: skip
    if name == "spans":  # positional: FalkorDB's parameter header would repeat every key for every row
        spans = [[r[c] for c in SPAN_COLUMNS] for r in rows]
        return spans if empty else [bare(p) for p in spans]
    if name == "child_of":
        return [[r["id"], r["parent"]] for r in rows]
    if name in ("services", "operations"):
        unique = {r.get("key", r.get("name")): r for r in rows}
        return list(unique.values())
    if name in ("calls", "stats"):
        return [{**r, "stamp": stamp(r)} for r in rows]
    return rows


def sent(rows: list[Any], *, empty: bool = False) -> list[Any]:
    """Trace rows (:func:`rows_for`) as the lookup and merging statements take them: new rows with each span's empty
    details as null (:func:`bare`), unless ``empty``; the batch's rows are not changed."""
    return rows if empty else [[*row[:_SPANS], _spans(row[_SPANS], False)] for row in rows]


def repeats_span(ids: list[Any]) -> bool:
    """Whether the span ids of trace rows name one span twice (then one statement must merge them:
    ``schema.traces.MERGING``)."""
    return len(set(ids)) < len(ids)


def linked(rows: list[Any], *, empty: bool = False) -> tuple[list[Any], list[bool]]:
    """Trace rows (:func:`rows_for`) as ``schema.traces.FRESH`` takes them: each with its ordinal after its columns,
    each span with its empty details as null (as :func:`bare`, unless ``empty``), its parent's place in the row
    after its columns (-1 when not there) and its parent's id only when not there; and, per row, whether it names a
    parent that is not one of its spans (the span may wait for it: ``ADOPT``). One pass, one new list per span:
    this runs for nearly every kept span the daemon writes."""
    out, outside = [], []
    for n, row in enumerate(rows):
        spans = row[_SPANS] or []
        place = {p[0]: i for i, p in enumerate(spans)}
        kept = []
        away = False
        for p in spans:
            parent = p[1]
            at = place.get(parent, -1) if parent is not None else -1
            if at >= 0:
                parent = None
            elif parent is not None:
                away = True
            span = list(p) if empty else bare(p)  # a new list either way: the batch's rows stay as they are
            span[1] = parent
            span.append(at)
            kept.append(span)
        out.append([*row[:_SPANS], kept, n])
        outside.append(away)
    return out, outside


def split(name: str, row: Any) -> list[Any]:
    """``row`` as two rows that write what it writes, or ``[]`` when it cannot be split."""
    if name in ("traces", "late_traces") and isinstance(row, list) and len(row[_SPANS] or []) > 1:
        spans = row[_SPANS]
        half = len(spans) // 2
        return [[*row[:_SPANS], spans[:half]], [*row[:_SPANS], spans[half:]]]
    return []


def longest_text(value: Any) -> int:
    """The length of the longest text anywhere in ``value`` (lists and maps included)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list | tuple):
        return max((longest_text(v) for v in value), default=0)
    if isinstance(value, Mapping):
        return max((longest_text(v) for v in value.values()), default=0)
    return 0


def trimmed(value: Any, limit: int) -> Any:
    """``value`` with every text longer than ``limit`` cut to ``limit`` characters and a marker saying how long it
    was (the marker names trace-repro, so a reader knows the graph holds less than the telemetry said)."""
    if isinstance(value, str):
        if len(value) <= limit:
            return value
        return f"{value[:limit]}…[trace-repro: trimmed to {limit} of {len(value)} characters]"
    if isinstance(value, list | tuple):
        return [trimmed(v, limit) for v in value]
    if isinstance(value, Mapping):
        return {k: trimmed(v, limit) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A row of upsert ``op`` that FalkorDB refused for its content: the message the runtime dead-letters."""

    op: str
    row: Any
    error: str
    reason: str = DEAD_REASON

    @property
    def key(self) -> bytes:
        return f"graph:{self.op}".encode()

    @property
    def value(self) -> bytes:
        """The row as JSON, with the column names of a positional row: what a replay of it needs."""
        doc: dict[str, Any] = {"op": self.op, "row": self.row}
        if self.op in _COLUMNS:
            doc["columns"] = list(_COLUMNS[self.op])
            if self.op in ("traces", "late_traces"):
                doc["span_columns"] = list(PATH_SPAN_COLUMNS)
        return json.dumps(doc, default=str).encode()

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return (("reason", self.reason.encode()), ("error", self.error[:1000].encode("utf-8", "replace")),
                ("component", b"graph"), ("graph.op", self.op.encode()))  # fmt: skip
