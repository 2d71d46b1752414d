"""The writer's path for the trace upserts (``traces``, ``late_traces``): which statement writes which rows.

A statement's rows are written with :data:`traces.MERGING` when they name one span twice (a span created twice
breaks its key). Otherwise the writer first asks the graph which of their traces it has and which of their access
spans (:data:`traces.PRESENT`): a row change or an incident may have made a placeholder of an access span before its
trace came, and no other span is in the graph without its trace (each is created with its OF edge, and retention
deletes a Trace only once it has no span). Only for the traces the graph has (a replay, a late fragment) does a
second read look up their other spans. A span missed all the same is caught by its unique key, as a span made
meanwhile by another writer is. The rows none of whose spans are there are written with ``traces.FRESH`` (or
``traces.CREATED`` for a trace the graph does not have either: :func:`traces.fresh_parts`), the others with the
lookup form (``schema.UPSERTS``). A statement of new spans the graph refuses (a span made meanwhile by another
writer, too big, a row's content) is written again with the lookup form, under the writer's usual rules.

``settled`` tells :meth:`GraphWriter.adopt` which traces need no adoption: those whose rows were all written the
FRESH way, new to the graph, with each span's parent in its row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sinks.graph import rows as row_forms
from sinks.graph import schema
from sinks.graph.errors import Refused
from sinks.graph.rows import DeadRow, repeats_span, sent
from sinks.graph.schema import traces

if TYPE_CHECKING:
    from sinks.graph.writer import GraphWriter

_SPANS = traces.TRACE_COLUMNS.index("spans")  # a trace row's kept spans


async def write(writer: GraphWriter, name: str, rows: list[Any], dead: list[DeadRow] | None,
                settled: dict[str, bool], accessed: set[str] | None = None) -> int:  # fmt: skip
    """Write one chunk of trace rows of upsert ``name`` (module docstring); returns the rows written. Settled: FRESH,
    a new trace, each span's parent in the row. ``accessed``: the span ids of the batch's access rows and row
    changes (the only spans that can be in the graph before their trace), or None to look every span up."""
    before = {row[0]: settled.get(row[0], True) for row in rows}
    settled.update(dict.fromkeys(before, False))  # until written with FRESH
    empty = writer.empty_details
    ids = [p[0] for row in rows for p in row[_SPANS] or ()]
    if repeats_span(ids):
        return await writer.write_rows(name, traces.MERGING[name], sent(rows, empty=empty), dead)
    if not writer.create_fresh or not ids:
        return await writer.write_rows(name, schema.UPSERTS[name], sent(rows, empty=empty), dead)
    present: list[list[Any]] = []
    try:
        if accessed is None:  # every span id looked up
            await writer._statement("present", traces.PRESENT, [ids, [r[0] for r in rows]], present, shrinkable=False)
        else:
            asked = [[i for i in ids if i in accessed], [r[0] for r in rows]]
            await writer._statement("present", traces.PRESENT, asked, present, shrinkable=False)
            begun = {i for k, i in present if k == 1}
            others = [p[0] for r in rows if r[0] in begun for p in r[_SPANS] or () if p[0] not in accessed]
            if others:  # a replay, a late fragment: the other spans of the traces the graph has
                await writer._statement("present", traces.PRESENT, [others, []], present, shrinkable=False)
    except Refused:  # an id the graph will not read: write every row as if its spans were there
        present = [[0, i] for i in ids]
    known, begun = {i for k, i in present if k == 0}, {i for k, i in present if k == 1}
    if known:  # a replay, a late fragment: the rows with a span the graph has are written the lookup way
        new = [row for row in rows if not any(p[0] in known for p in row[_SPANS] or ())]
        fresh = {id(r) for r in new}
        old = sent([r for r in rows if id(r) not in fresh], empty=empty)
        written = await writer.write_rows(name, schema.UPSERTS[name], old, dead)
    else:
        new, written = rows, 0
    fresh_rows, outside = row_forms.linked(new, empty=empty)
    try:
        for statement, part in traces.fresh_parts(name, fresh_rows, begun, writer.create_traces):
            await writer._statement(name, statement, part, None, shrinkable=True)
    except Refused:  # a span made meanwhile, too big, or a row's content: the usual statement
        return written + await writer.write_rows(name, schema.UPSERTS[name], sent(new, empty=empty), dead)
    good = {id(r) for r, away in zip(new, outside, strict=True) if r[0] not in begun and not away}
    unsettled = {r[0] for r in rows if id(r) not in good}
    settled.update({t: was and t not in unsettled for t, was in before.items()})
    return written + len(new)
