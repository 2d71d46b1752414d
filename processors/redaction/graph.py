"""Redaction of the rows a stage writes to the graph, so that what reads the graph (the MCP server's tools, its
``query_graph``, a person with a Cypher console) finds the same markers as the published events.

Three places hold production values: a row change's ``before``/``after`` images (JSON text on the Change edge and
the Entity's ``image``), an access's ``params`` and ``predicate``, and a span's statement text (inline literals).
Images are redacted by column; parameters by the column their statement binds them to (the statement of their span,
from the same batch: a stage writes a trace's spans with its accesses; a span the batch does not hold leaves its
parameters to ``unknown_parameters``); statements by their literals' columns; a predicate's text loses every value
its parameters lost. Entity keys are kept in the graph whatever ``keys`` says (they are its identifiers).
"""

from __future__ import annotations

import json
from typing import Any

from processors.model.graph import GraphBatch, Row
from processors.redaction.literals import Literals
from processors.redaction.params import ParameterColumns
from processors.redaction.policy import Policy, is_marker

MIN_TEXT = 4


def redact_batch(batch: GraphBatch, policy: Policy, params: ParameterColumns, literals: Literals) -> None:
    """Redact ``batch``'s rows in place (see the module docstring)."""
    if not policy.enabled:
        return
    for row in batch.changes:
        for side in ("before", "after"):
            if isinstance(row.get(side), str):
                row[side] = _image(row[side], str(row.get("table") or ""), policy)
    statements: dict[str, str] = {}  # span id -> its statement as sent, of the spans that have one
    for row in batch.spans:
        statements[str(row.get("id"))] = row.get("statement") or ""
        row["statement"] = literals(row.get("statement") or "")
    for trace in (*batch.traces, *batch.late_traces):  # a trace's kept spans: most have no statement (no DB call)
        for span in trace.get("spans") or ():
            if text := span[-1]:
                statements[str(span[0])] = text
                span[-1] = literals(text)
    for rows in (batch.reads, batch.writes, batch.predicates):
        for row in rows:
            _access(row, statements.get(str(row.get("span")), ""), policy, params)


def _image(text: str, table: str, policy: Policy) -> str:
    try:
        image = json.loads(text)
    except ValueError:
        return text
    if not isinstance(image, dict):
        return text
    out = {col: policy.apply(policy.action(table, col), v) for col, v in image.items()}
    if all(out[col] is v for col, v in image.items()):
        return text  # nothing redacted: the text as written (no second serialisation on the hot path)
    return json.dumps(out, sort_keys=True, default=str)


def _access(row: Row, statement: str, policy: Policy, params: ParameterColumns) -> None:
    values = row.get("params")
    if not isinstance(values, list) or not values:
        return
    table, bound = str(row.get("table") or ""), params.of(statement)
    unknown = policy.config.unknown_parameters
    out: list[Any] = []
    predicate = str(row.get("predicate") or "")
    for i, value in enumerate(values):
        action = policy.action(table, bound[i]) if i in bound else unknown
        redacted = policy.apply(action, value)
        if redacted is not value and not is_marker(value) and predicate and len(str(value)) >= MIN_TEXT:
            predicate = predicate.replace(repr(value), repr(redacted)).replace(str(value), str(redacted))
        out.append(redacted)
    row["params"] = out
    if "predicate" in row:
        row["predicate"] = predicate


__all__ = ["redact_batch"]
