"""Published events as graph rows: the parameters of ``schema.RECORDS`` (one function per kind).

An incident is an ``Incident`` node per fingerprint with an ``Occurrence`` per occurrence; a regression likewise,
``ON`` its ``Operation``; a finding of any other type likewise, labelled ``Finding`` too (its type, title, subject,
severity, remedy, and data as JSON), ``ON`` the Operation or Service its subject names; a verdict a ``Verdict``
that ``JUDGES`` its ``Contract``; a contract a ``Contract`` ``FOR`` its incident, with the whole contract as JSON so
that a restarted daemon resumes its watch. Every recorded event also gets a ``Published {id}`` node (its
``event_id``), which is how a replay is recognised.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from processors.model.base import Published
from processors.model.contract import ProofContract
from processors.model.finding import Finding, FindingEvent, register_renderer, renderer_for
from processors.model.graph import Row
from processors.model.incident import IncidentEvent
from processors.model.regression import RegressionEvent
from processors.model.repro import ReproEvent
from processors.model.verdict import VerdictEvent
from processors.pipeline.requests import operation_key_of
from sinks.graph.schema import RECORDS


def incident_row(e: IncidentEvent) -> Row:
    return {
        "fingerprint": e.fingerprint,
        "occurrence": e.occurrence,
        "anomaly": e.anomaly,
        "severity": e.severity,
        "manifest": e.manifest,
        "table": e.table,
        "entity": e.entity,
        "window_ms": e.window_ms,
        "at": e.seen_unix_ms(),
        "culprit": e.culprit.span_id,
        "victim": e.victim.span_id,
        "summary": e.summary,
        "writers": [f"{w.function or w.service}:{w.lock}" for w in e.writers],
    }


def regression_row(e: RegressionEvent) -> Row:
    return {
        "fingerprint": e.fingerprint,
        "occurrence": e.occurrence,
        "metric": e.metric,
        "signature": e.signature,
        "summary": e.summary,
        "at": e.seen_unix_ms(),
        "version": e.version,
        "commit": e.commit,
        "window": e.window,
        "p_adjusted": min(ev.p_adjusted for ev in e.evidence) if e.evidence else None,
        "service": e.service,
        "operation": e.operation,
        "operation_key": operation_key_of(e.service, e.operation),
    }


def finding_row(e: FindingEvent) -> Row:
    """A finding of any registered type: its ``Incident:Finding`` node (one per fingerprint, so contracts, verdicts,
    repros and the MCP tools find it as they find an incident), an ``Occurrence``, and ``ON`` its Operation (or its
    Service) when its subject names one. Its typed data is stored as JSON, as it was published."""
    s = e.subject
    return {
        "fingerprint": e.fingerprint,
        "occurrence": e.occurrence,
        "type": e.type,
        "title": e.title,
        "severity": e.severity,
        "remedy": e.remedy,
        "service": s.service,
        "operation": s.operation,
        "operation_key": operation_key_of(s.service, s.operation) if s.service and s.operation else None,
        "entity": s.entity,
        "version": s.version,
        "at": e.seen_unix_ms(),
        "data": json.dumps(e.data, sort_keys=True, default=str),
        "evidence": list(e.evidence),
        "traces": list(e.traces),
        "contract": e.contract.signature if e.contract is not None else None,
    }


def verdict_row(v: VerdictEvent) -> Row:
    """One ``Verdict`` per outcome per build of a contract."""
    return {
        "key": f"{v.fingerprint}|{v.service}|{v.version}|{v.outcome}",
        "outcome": v.outcome,
        "service": v.service,
        "version": v.version,
        "commit": v.commit,
        "rollback": v.rollback,
        "reason": v.reason,
        "receipt": json.dumps(v.receipt.model_dump(), sort_keys=True),
        "at": v.receipt.window_end_unix_ms,
        "contract": v.contract,
    }


def contract_row(c: ProofContract) -> Row:
    return {
        "signature": c.signature,
        "fingerprint": c.fingerprint,
        "must_start": c.must_start,
        "watch_s": c.watch_s,
        "min_requests": c.min_requests,
        "alpha": c.alpha,
        "baseline_rate": c.baseline_rate,
        "service": c.service,
        "version": c.version,
        "issue": c.issue,
        "created": c.created_unix_ms,
        "json": c.model_dump_json(),  # the whole contract, so that a restarted daemon resumes its watch
    }


# A finding's rows: a renderer of the ``graph_rows`` surface returns ``(record, row)``, a record of
# ``schema.RECORDS`` and its parameters; incidents and regressions register theirs by kind, every other finding
# gets the generic ``finding`` record, and a type may register its own (a row for a record of the schema: the Cypher
# stays there).
GRAPH_ROWS = "graph_rows"
register_renderer(GRAPH_ROWS, "incident", lambda e: ("incident", incident_row(e)))
register_renderer(GRAPH_ROWS, "regression", lambda e: ("regression", regression_row(e)))
register_renderer(GRAPH_ROWS, "*", lambda e: ("finding", finding_row(e)))
ROWS: dict[type[Published], tuple[str, Callable[..., Row]]] = {
    VerdictEvent: ("verdict", verdict_row),
    ProofContract: ("contract", contract_row),
}


def rows_of(e: Published) -> tuple[str, Row] | None:
    """The record and row of one event, or None for a kind the graph does not model (a Published node only)."""
    render = renderer_for(GRAPH_ROWS, e) if isinstance(e, Finding) else None
    if render is not None:
        record, row = render(e)
        if record not in RECORDS:
            raise ValueError(f"a graph_rows renderer names no record of the schema: {record}")
        return str(record), row
    entry = ROWS.get(type(e))
    return (entry[0], entry[1](e)) if entry is not None else None


def rows_by_kind(events: list[Published]) -> dict[str, list[Row]]:
    """The rows of ``schema.RECORDS`` per record, for the kinds the graph models (others get a Published node only)."""
    out: dict[str, list[Row]] = {}
    for e in events:
        found = rows_of(e)
        if found is not None:
            out.setdefault(found[0], []).append(found[1])
    return out


def published_row(e: Published, at_ms: float) -> Row:
    return {"id": e.event_id, "kind": getattr(e, "kind", ""), "at": at_ms}


def repro_params(event: ReproEvent) -> Row:
    """Parameters of ``schema.REPRO_UPSERT``: the Repro node and one Repair per planned repair."""
    status = "proven" if event.proven else ("red" if event.red.status == "failed" else "unproven")
    repairs = [{"key": f"{event.fingerprint}|{r.file}|{r.function}|{r.statement_before}", **r.model_dump()}
               for r in event.repairs]  # fmt: skip
    return {"fp": event.fingerprint, "path": event.test_path, "status": status, "level": event.level,
            "faithful": event.divergence.faithful, "red": event.red.status,
            "green": event.green.status if event.green else "", "repairs": repairs}  # fmt: skip
