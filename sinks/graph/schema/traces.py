"""The trace upserts (``traces``, ``late_traces``): a Trace with its kept spans, their OF and CHILD_OF edges.

A late fragment of a trace (spans after it closed) widens it and can only turn it to error; its root, service,
version and summary of omitted spans come from the fragment that holds the root span (or the first written). Under
the ``paths`` policy the row carries the trace's kept spans (positional, PATH_SPAN_COLUMNS, in any order) with OF and
CHILD_OF; under the other policies it is empty.

**Spans new to the graph are created, not merged** (:func:`traces`): a span is looked up by its id first; one not in
the graph is created with its properties and its OF edge, and its CHILD_OF edge is created too; only a span already
there (a replay, or the placeholder a row change made) is updated and its edges merged. A MERGE of each new span, a
SET of each property and the MERGE of each new edge (an ``Expand Into`` per edge, a third of the statement's time
on the server) cost FalkorDB 1.6 times what this does (bench/RESULTS.md, issue 37). Two rows of one statement must not
create the same span (the unique constraint would refuse the whole statement): a statement whose rows name a span
twice is written with :func:`merging`, the form that merges every span (``GraphWriter`` chooses, see
``sinks.graph.rows.repeats_span``).

A span names its parent, which may not be in the graph yet (a trace that closed before its root arrived is written
in fragments, in any order): the edge is made if the parent is there, else the span keeps ``awaiting_parent`` until
``ADOPT``, after a later write of its trace, finds the parent. Only a span without its parent is updated (a SET of
every span, to NULL when the parent is there, was an eighth of the trace upsert's time on the server): a span
replayed after its parent came has the edge merged here, and its old ``awaiting_parent`` cleared by ADOPT, which
``GraphWriter.write`` runs after every batch's upserts for the traces they wrote. The parents are looked up after
every span of the statement is in the graph (``collect`` waits for all of them).

**Rows whose spans are all new** (:func:`fresh`; ``GraphWriter`` asks the graph first which spans are there,
:data:`PRESENT`) are written without the lookup of each span: every span is CREATEd and stays bound, so its CHILD_OF
edge goes to its parent by the parent's place in the row (``rows.linked``: the column after the span's, and the
parent's id only when it is not in the row). A span whose parent is not in its row (a fragment) is created waiting
for it (``awaiting_parent``), and ``ADOPT``, which ``GraphWriter.write`` runs for its trace after the batch's
upserts, links it if the parent is in the graph: no lookup of a parent in this statement (the lookup of every span's
parent id, null for a parent in the row, and the ``FOREACH`` of each edge cost FalkorDB a third of the statement's
time: bench/RESULTS.md, issue 37, 2026-12-07). The lookup form's per-span lookup, its ``FOREACH`` and its second
lookup of each span and its parent cost FalkorDB 0.4 times what this form does (bench/RESULTS.md, issue 37). A span
another writer creates between the read and the write makes the unique constraint refuse the statement: the writer
then writes its rows with :func:`traces`. The same read says which traces the graph had: a trace whose rows all went
this way, new to the graph and with each span's parent in its row, has no span waiting, and ``GraphWriter.write``
does not run ``ADOPT`` for it. A row of ``traces`` whose trace the graph does not have either (and no other row of
the statement names) creates its Trace too (:data:`CREATED`): no MERGE, none of the conditional SETs that merge a
fragment into a trace already there; a Trace another writer makes meanwhile breaks its unique constraint, as above.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from processors.graph.rows import PATH_SPAN_COLUMNS

# Column order of a Trace row as the writer sends it (positional, see ``sinks.graph.rows.rows_for``).
TRACE_COLUMNS = ("id", "root", "service", "start", "end", "status", "version", "rooted", "omitted", "spans")
_T = {c: f"r[{i}]" for i, c in enumerate(TRACE_COLUMNS)}
_P = {c: f"p[{i}]" for i, c in enumerate(PATH_SPAN_COLUMNS)}
_PROPS = [c for c in PATH_SPAN_COLUMNS if c not in ("id", "parent")]  # a span's properties besides its id (and trace)
_WHEN = "FOREACH (_ IN CASE WHEN {cond} THEN [1] ELSE [] END | {then}) "

AWAIT = (  # the CHILD_OF edge of {child} to {node}, the parent {parent} (id) if found: merged (also ``child_of``)
    "FOREACH (_ IN CASE WHEN {node} IS NULL THEN [1] ELSE [] END | SET {child}.awaiting_parent = {parent}) "
    "WITH {child}, {node} WHERE {node} IS NOT NULL MERGE ({child})-[:CHILD_OF]->({node})"
)


def _trace(clause: str) -> str:
    """The Trace of the row; ``clause`` is MERGE (``traces``) or MATCH (``late_traces``: a late fragment the policy
    would not detail completes a trace already in the graph and never starts one)."""
    return (
        f"UNWIND $rows AS r {clause} (t:Trace {{id: {_T['id']}}}) "
        f"WITH t, r, ({_T['rooted']} OR t.root IS NULL) AS take, "
        f"CASE WHEN t.start IS NULL OR {_T['start']} < t.start THEN {_T['start']} ELSE t.start END AS start, "
        f"CASE WHEN t.start IS NULL OR {_T['end']} > t.start + t.duration_ms THEN {_T['end']} "
        "ELSE t.start + t.duration_ms END AS end "
        f"SET t.root = CASE WHEN take THEN {_T['root']} ELSE t.root END, "
        f"t.service = CASE WHEN take THEN {_T['service']} ELSE t.service END, "
        f"t.version = CASE WHEN take THEN {_T['version']} ELSE t.version END, "
        f"t.omitted = CASE WHEN take OR t.omitted IS NULL THEN {_T['omitted']} ELSE t.omitted END, "
        "t.start = start, t.duration_ms = end - start, "
        f"t.status = CASE WHEN t.status = 'error' THEN 'error' ELSE {_T['status']} END "
    )


def traces(clause: str) -> str:
    """The trace upsert that creates the spans new to the graph (module docstring)."""
    created = ", ".join([f"id: {_P['id']}", f"trace: {_T['id']}"] + [f"{c}: {_P[c]}" for c in _PROPS])
    updated = ", ".join([f"x.trace = {_T['id']}"] + [f"x.{c} = {_P[c]}" for c in _PROPS])
    return (
        _trace(clause)
        + f"WITH t, r UNWIND {_T['spans']} AS p OPTIONAL MATCH (x:Span {{id: {_P['id']}}}) "
        + _WHEN.format(cond="x IS NULL", then=f"CREATE (:Span {{{created}}})-[:OF]->(t)")
        + _WHEN.format(cond="x IS NOT NULL", then=f"SET {updated} MERGE (x)-[:OF]->(t)")
        + f"WITH collect(CASE WHEN {_P['parent']} IS NOT NULL THEN [{_P['id']}, {_P['parent']}, x IS NULL] END) AS l "
        "UNWIND l AS k WITH k[1] AS parent, k[2] AS fresh, k "
        "MATCH (s:Span {id: k[0]}) OPTIONAL MATCH (q:Span {id: parent}) "
        + _WHEN.format(cond="q IS NULL", then="SET s.awaiting_parent = parent")
        + _WHEN.format(cond="q IS NOT NULL AND fresh", then="CREATE (s)-[:CHILD_OF]->(q)")
        # (a FOREACH, not WITH ... WHERE: FalkorDB 4.x dropped the CREATE of the FOREACH before a filter)
        + _WHEN.format(cond="q IS NOT NULL AND NOT fresh", then="MERGE (s)-[:CHILD_OF]->(q)").rstrip()
    )


def merging(clause: str) -> str:
    """The trace upsert that merges every span: for a statement whose rows name a span more than once."""
    return (
        _trace(clause)
        + f"WITH t, r UNWIND {_T['spans']} AS p MERGE (s:Span {{id: {_P['id']}}}) SET s.trace = {_T['id']}, "
        + ", ".join(f"s.{c} = {_P[c]}" for c in _PROPS)
        + f" MERGE (s)-[:OF]->(t) WITH s, p WHERE {_P['parent']} IS NOT NULL "
        f"OPTIONAL MATCH (q:Span {{id: {_P['parent']}}}) {AWAIT.format(parent=_P['parent'], node='q', child='s')}"
    )


def _created() -> str:
    """The Trace of a row whose trace is not in the graph, created with the values ``_trace`` would set on it."""
    props = ["id", "root", "service", "version", "omitted", "start"]
    return (
        "UNWIND $rows AS r CREATE (t:Trace {"
        + ", ".join([f"{c}: {_T[c]}" for c in props] + [f"duration_ms: {_T['end']} - {_T['start']}"])
        + f", status: {_T['status']}}}) "
    )


def fresh(clause: str) -> str:
    """The trace upsert of rows whose spans are not in the graph (module docstring): each row carries its ordinal
    (``r[10]``) and each span its parent's place in the row (``p[16]``, -1 when not there: ``rows.linked``).
    ``clause`` CREATE: rows whose trace is not in the graph either (:func:`fresh_parts`)."""
    created = ", ".join([f"id: {_P['id']}", f"trace: {_T['id']}"] + [f"{c}: {_P[c]}" for c in _PROPS])
    at = len(PATH_SPAN_COLUMNS)
    return (
        (_created() if clause == "CREATE" else _trace(clause))
        + f"WITH t, r UNWIND {_T['spans']} AS p "
        + f"CREATE (s:Span {{{created}, awaiting_parent: {_P['parent']}}})-[:OF]->(t) "
        + f"WITH r[{len(TRACE_COLUMNS)}] AS row, collect(s) AS made, collect(p[{at}]) AS at "
        "UNWIND range(0, size(made) - 1) AS i WITH made, i, at[i] AS j WHERE j >= 0 "
        "WITH made[i] AS s, made[j] AS q CREATE (s)-[:CHILD_OF]->(q)"
    )


# Which of the spans (``rows[0]``, then 0) and of the traces (``rows[1]``, then 1) the graph has.
PRESENT = (
    "UNWIND $rows[0] AS id MATCH (:Span {id: id}) RETURN 0 AS k, id UNION ALL "
    "UNWIND $rows[1] AS id MATCH (:Trace {id: id}) RETURN 1 AS k, id"
)
UPSERTS = {"traces": traces("MERGE"), "late_traces": traces("MATCH")}
MERGING = {"traces": merging("MERGE"), "late_traces": merging("MATCH")}
FRESH = {"traces": fresh("MERGE"), "late_traces": fresh("MATCH")}
CREATED = fresh("CREATE")


def fresh_parts(name: str, rows: list[Any], begun: set[str], create: bool = True) -> list[tuple[str, list[Any]]]:
    """The statements that write ``rows`` (``rows.linked``) of new spans: those of a trace the graph does not have
    (``begun`` says which it has) and no other row names, of upsert ``traces``, with :data:`CREATED` (no MERGE of
    the Trace and none of its conditional SETs), the others with :data:`FRESH`."""
    counts = Counter(r[0] for r in rows)
    new = [r for r in rows if create and name == "traces" and r[0] not in begun and counts[r[0]] == 1]
    chosen = {id(r) for r in new}
    rest = [r for r in rows if id(r) not in chosen]
    return [(s, part) for s, part in ((CREATED, new), (FRESH[name], rest)) if part]
