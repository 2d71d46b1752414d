"""Markdown of an incident's issue: its title, its description with a Mermaid sequence diagram, and its notes.

Pure functions of the events (and the :class:`~sinks.gitlab.links.Links` of the config): the same event renders the
same text, byte for byte (golden-file tested). Trace ids are shown whole, linked to the trace UI; code locations
relative to the repository, linked at the deployed ref. Every
untrusted string goes through :mod:`sinks.gitlab.escape`: code spans in the Markdown, inert look-alikes in the
diagram, no live reference in the title. The description ends with the hidden state of :mod:`sinks.gitlab.state`;
every note starts with the marker of :mod:`sinks.gitlab.markdown`.
"""

from __future__ import annotations

import json
from typing import Any

from processors.connectors.proofs.contracts import contract_from_incident
from processors.model.contract import ProofContract
from processors.model.outputs import AccessInfo, IncidentEvent
from sinks.gitlab import contract_section
from sinks.gitlab.escape import code, mermaid_alias, mermaid_text, plain, title_text
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import anomaly_name, closed_since, event_id, footer, iso, marker, reopen_id
from sinks.gitlab.state import IssueState, occurrences_line, with_state


def _who(a: AccessInfo) -> str:
    return a.function or a.service or "unknown"


def _word(value: str) -> str:
    """A short untrusted word in prose or a table cell (an anomaly's name, an operation): no reference, no cell end."""
    return plain(value, 80).replace("|", "\\|")


def anomaly(e: IncidentEvent) -> str:
    """The class its issue is labelled with: its anomaly."""
    return e.anomaly


def title(e: IncidentEvent) -> str:
    """Stable per fingerprint: anomaly, table and the two code paths."""
    return title_text(
        f"[trace-repro] {plain(anomaly_name(e.anomaly))} on {plain(e.table)}: {plain(_who(e.culprit))} vs "
        f"{plain(_who(e.victim))}"
    )


# ---- the issue description --------------------------------------------------------------------------------------


def _role(trace_id: str, e: IncidentEvent) -> str:
    if trace_id and trace_id == e.culprit.trace_id:
        return "culprit"
    if trace_id and trace_id == e.victim.trace_id:
        return "victim"
    return "other"


def _image(row: dict[str, Any] | None) -> str:
    if row is None:
        return "∅"
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(row.items())) + "}"


def _params(a: AccessInfo) -> str:
    return json.dumps(a.params, default=str, ensure_ascii=False) if a.params else ""


def _outcome(a: AccessInfo) -> str:
    if not a.error:
        return "ok"
    status = f" (HTTP {a.http_status})" if a.http_status else ""
    return f"request failed: {code(a.exception or 'error', cell=True)}{status}"


def _ms(value: float) -> str:
    return f"{value:+.1f}"


def _overview(e: IncidentEvent, links: Links) -> list[str]:
    state = "manifest (the damage happened)" if e.manifest else "latent (the race happened, no damage seen yet)"
    return [
        "| | |",
        "|---|---|",
        f"| **Anomaly** | {_word(anomaly_name(e.anomaly))} ({code(e.anomaly, cell=True)}) |",
        f"| **Severity** | {code(e.severity, cell=True)}: {state} |",
        f"| **Table** | {code(e.table, cell=True)} |",
        f"| **Entity** | {code(e.entity, cell=True)} |",
        f"| **Causal window** | {e.window_ms:.1f} ms |",
        f"| **Confidence** | {e.confidence:.2f} |",
        f"| **Culprit trace** | {links.trace(e.culprit.trace_id, cell=True)} ({code(e.culprit.service, cell=True)}) |",
        f"| **Victim trace** | {links.trace(e.victim.trace_id, cell=True)} ({code(e.victim.service, cell=True)}) |",
        f"| **Fingerprint** | {code(e.fingerprint, cell=True)} |",
        f"| **First occurrence** | {code(e.occurrence, cell=True)}, judged at {iso(e.detected_at_unix_ms)} |",
    ]


def _writers(e: IncidentEvent, links: Links) -> list[str]:
    lines = [
        "| Role | Function | File | Route | Lock | Statement | Parameters | Trace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in e.writers:
        cells = [
            _role(w.trace_id, e),
            code(_who(w), cell=True),
            links.file(w.file, w.line, version=w.version, service=w.service, cell=True),
            code(w.route, cell=True),
            code(w.lock, cell=True),
            code(w.statement, cell=True),
            code(_params(w), cell=True, limit=120),
            links.trace(w.trace_id, cell=True),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _timeline(e: IncidentEvent) -> list[str]:
    rows: list[tuple[float, int, str]] = []
    for i, a in enumerate(e.accesses):
        cells = [_ms(a.offset_ms), _role(a.trace_id, e), _word(a.operation), code(a.lock, cell=True),
                 code(a.statement, cell=True), _outcome(a)]  # fmt: skip
        rows.append((a.offset_ms, i, "| " + " | ".join(cells) + " |"))
    for j, c in enumerate(e.commits):
        change = f"{_image(c.before)} → {_image(c.after)}"
        cells = [_ms(c.offset_ms), _role(c.trace_id, e), f"commit lsn {c.lsn} tx {code(c.tx_id, cell=True)}", "—",
                 code(change, cell=True), f"committed ({code(c.correlation, cell=True)})"]  # fmt: skip
        rows.append((c.offset_ms, len(e.accesses) + j, "| " + " | ".join(cells) + " |"))
    return [
        "Offsets in ms from the culprit's first conflicting write.",
        "",
        "| Offset (ms) | Request | Event | Lock | Statement or change | Outcome |",
        "|---:|---|---|---|---|---|",
        *(row for _, _, row in sorted(rows)),
    ]


def mermaid(e: IncidentEvent) -> str:
    """The collision as a Mermaid sequence diagram: both requests, the row, statements, commits, the damage."""
    ids = {"culprit": "C", "victim": "V", "other": "O"}
    lines = [
        "sequenceDiagram",
        f"    participant C as culprit {mermaid_alias(_who(e.culprit))} {mermaid_alias(e.culprit.trace_id[:8])}",
        f"    participant R as row {mermaid_alias(e.entity)}",
        f"    participant V as victim {mermaid_alias(_who(e.victim))} {mermaid_alias(e.victim.trace_id[:8])}",
    ]
    roles = {_role(a.trace_id, e) for a in e.accesses} | {_role(c.trace_id, e) for c in e.commits if c.trace_id}
    if "other" in roles:
        lines.append("    participant O as other writers")
    steps: list[tuple[float, int, str]] = []
    for i, a in enumerate(e.accesses):
        lock = "" if a.lock == "none" else f" [{a.lock}]"
        label = mermaid_text(f"{_ms(a.offset_ms)} ms {a.operation}{lock} {a.statement}")
        steps.append((a.offset_ms, i, f"    {ids[_role(a.trace_id, e)]}->>R: {label}"))
    for j, c in enumerate(e.commits):
        text = mermaid_text(f"commit lsn {c.lsn} tx {c.tx_id} at {_ms(c.offset_ms)} ms")
        line = f"    R-->>{ids[_role(c.trace_id, e)]}: {text}" if c.trace_id else f"    Note right of R: {text}"
        steps.append((c.offset_ms, len(e.accesses) + j, line))
    lines += [step for _, _, step in sorted(steps)]
    if e.victim.error:
        failure = f"request failed: {e.victim.exception or 'error'}"
        lines.append(f"    Note right of V: {mermaid_text(failure)}")
    damage = e.damage if e.damage else "latent: no damage observed"
    lines.append(f"    Note over C,V: {mermaid_text(damage)}")
    return "\n".join(lines)


def filed_contract(e: IncidentEvent) -> ProofContract:
    """The proof contract the issue is filed with: the incident's, promising :func:`contract_section.promised_event`
    (a person edits it in the issue)."""
    return contract_from_incident(e, contract_section.promised_event(e.fingerprint), automatic=True,
                                  now_ms=e.detected_at_unix_ms)  # fmt: skip


def description(e: IncidentEvent, state: IssueState | None = None, links: Links | None = None) -> str:
    """The issue description of the incident ``e`` (the occurrence that filed it)."""
    links = links or Links()
    state = state or IssueState.first(e)
    damage = code(e.damage) if e.damage else "_None observed: the collision is latent._"
    parts = [
        f"## {_word(anomaly_name(e.anomaly))} on {code(e.entity)}",
        "",
        f"> {code(e.summary, limit=400)}",
        "",
        *_overview(e, links),
        "",
        occurrences_line(state),
        "",
        *contract_section.render(filed_contract(e)),
        "",
        "### Damage",
        "",
        damage,
        "",
        "### Writers",
        "",
        *_writers(e, links),
        "",
        "### Timeline",
        "",
        *_timeline(e),
        "",
        "### Sequence",
        "",
        "```mermaid",
        mermaid(e),
        "```",
        "",
        "### Evidence",
        "",
        *(f"- {code(line, limit=400)}" for line in e.evidence),
        *([] if e.evidence else ["_No evidence lines._"]),
        "",
        *footer(e.fingerprint, e.schema_version),
    ]
    return with_state("\n".join(parts), state)


# ---- notes ------------------------------------------------------------------------------------------------------


def occurrence_note(e: IncidentEvent, number: int, *, last: bool, links: Links | None = None) -> str:
    """A note for a repeated occurrence (only the first few repeats get one)."""
    links = links or Links()
    state = "manifest" if e.manifest else "latent"
    lines = [
        marker(event_id(e)),
        f"**Occurrence {number}** on {code(e.entity)} at {iso(e.culprit.start_unix_ms)}: {code(e.severity)} ({state}).",
        "",
        f"- culprit {code(_who(e.culprit))} ({code(e.culprit.route)}, build {code(e.culprit.version)}), trace "
        f"{links.trace(e.culprit.trace_id)}",
        f"- victim {code(_who(e.victim))} ({code(e.victim.route)}) at {_ms(e.victim.offset_ms)} ms, trace "
        f"{links.trace(e.victim.trace_id)}",
        f"- damage: {code(e.damage) if e.damage else 'none observed'}",
    ]
    if last:
        lines += ["", "_Further occurrences only update the count in the description._"]
    return "\n".join(lines) + "\n"


def reopen_note(e: IncidentEvent, fixed_after_ms: float | None) -> str:
    """The note that explains why a closed issue is reopened."""
    return (
        f"{marker(reopen_id(e))}\n"
        f"### Regression\n\n"
        f"This defect happened again after {closed_since(fixed_after_ms)}: occurrence {code(e.occurrence)} on "
        f"{code(e.entity)} at {iso(e.culprit.start_unix_ms)}, build {code(e.culprit.service)} "
        f"{code(e.culprit.version)}.\n"
        f"Reopening.\n"
    )


def upgrade_note(e: IncidentEvent) -> str:
    """The note that says the description now shows a better-evidenced occurrence."""
    what = [w for w, has in (("manifest", e.manifest), ("its row changes correlated", e.correlated)) if has]
    return (
        f"{marker(f'upgrade-{e.occurrence}')}\n"
        f"**Better evidence:** occurrence {code(e.occurrence)} on {code(e.entity)} at {iso(e.culprit.start_unix_ms)} "
        f"({', '.join(what) or 'latent'}, confidence {e.confidence:.2f}) replaces the one the description showed.\n"
    )


__all__ = [
    "anomaly",
    "description",
    "filed_contract",
    "mermaid",
    "occurrence_note",
    "reopen_note",
    "title",
    "upgrade_note",
]
