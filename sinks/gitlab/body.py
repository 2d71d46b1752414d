"""Markdown of the GitLab issue (description with a Mermaid sequence diagram), its notes, and its hidden state.

Pure functions of the events: the same event renders the same text, byte for byte (golden-file tested). Every
untrusted string goes through :mod:`sinks.gitlab.escape`. The description ends with one hidden line,
``<!-- trace-repro:state {...} -->``, holding what later events need after a restart (occurrence count, recent
occurrence ids, the FIXED verdicts applied); its JSON has ``<``, ``>`` and ``&`` escaped, so it cannot end the
comment early. Notes start with a hidden marker ``<!-- trace-repro:event:<id> -->`` that makes posting idempotent.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sinks.gitlab.escape import code, mermaid_alias, mermaid_text, one_line, title_text
from streamer.schemas import AccessInfo, IncidentEvent, ReproEvent, VerdictEvent

ANOMALIES = {
    "lost_update": "Lost update",
    "invariant_violation": "Invariant violation",
    "duplicate_apply": "Duplicate apply",
    "write_skew": "Write skew",
}
RECENT_OCCURRENCES = 50
RECENT_VERDICTS = 20
FP_LABEL_PREFIX = "trace-repro::fp::"
_STATE = re.compile(r"^<!-- trace-repro:state (\{.*\}) -->$", re.MULTILINE)
_OCCURRENCES = re.compile(r"^\*\*Occurrences:\*\* .*$", re.MULTILINE)
_ID = re.compile(r"[^A-Za-z0-9_.-]+")

Event = IncidentEvent | ReproEvent | VerdictEvent


# ---- identities -------------------------------------------------------------------------------------------------


def fingerprint_label(fingerprint: str) -> str:
    """The scoped label that finds the one issue of a fingerprint."""
    return FP_LABEL_PREFIX + _ID.sub("_", fingerprint)


def event_id(event: Event) -> str:
    """A stable id per event: the occurrence for incidents, a digest of the whole event otherwise."""
    if isinstance(event, IncidentEvent):
        return "incident-" + _ID.sub("_", event.occurrence)
    digest = hashlib.sha256(event.model_dump_json().encode()).hexdigest()[:16]
    return f"{event.kind}-{digest}"


def marker(note_id: str) -> str:
    """The hidden first line of a note; a note carrying it is never posted twice."""
    return f"<!-- trace-repro:event:{_ID.sub('_', note_id)} -->"


def anomaly_name(anomaly: str) -> str:
    return ANOMALIES.get(anomaly, anomaly.replace("_", " ").capitalize())


def iso(unix_ms: float) -> str:
    """A Unix time in milliseconds as ISO 8601 UTC with millisecond precision."""
    return datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _who(a: AccessInfo) -> str:
    return a.function or a.service or "unknown"


def title(e: IncidentEvent) -> str:
    """Stable per fingerprint: anomaly, table and the two code paths."""
    return title_text(f"[trace-repro] {anomaly_name(e.anomaly)} on {e.table}: {_who(e.culprit)} vs {_who(e.victim)}")


# ---- hidden state -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IssueState:
    """What the sink must remember about an issue across restarts; stored in its description."""

    fingerprint: str
    occurrences: int
    manifest: int
    first_seen_ms: float
    last_seen_ms: float
    last_entity: str
    recent: tuple[str, ...]
    verdicts: tuple[str, ...] = ()
    fixed_after_ms: float | None = None

    @classmethod
    def first(cls, e: IncidentEvent) -> IssueState:
        at = e.culprit.start_unix_ms
        return cls(e.fingerprint, 1, int(e.manifest), at, at, e.entity, (e.occurrence,))

    def seen(self, occurrence: str) -> bool:
        return occurrence in self.recent

    def with_occurrence(self, e: IncidentEvent) -> IssueState:
        at = e.culprit.start_unix_ms
        latest = at >= self.last_seen_ms
        return replace(
            self,
            occurrences=self.occurrences + 1,
            manifest=self.manifest + int(e.manifest),
            first_seen_ms=min(self.first_seen_ms, at),
            last_seen_ms=at if latest else self.last_seen_ms,
            last_entity=e.entity if latest else self.last_entity,
            recent=(*self.recent, e.occurrence)[-RECENT_OCCURRENCES:],
        )

    def with_fix(self, verdict: str, after_ms: float) -> IssueState:
        return replace(self, verdicts=(*self.verdicts, verdict)[-RECENT_VERDICTS:], fixed_after_ms=after_ms)

    def comment(self) -> str:
        data = {
            "v": 1,
            "fingerprint": self.fingerprint,
            "occurrences": self.occurrences,
            "manifest": self.manifest,
            "first_seen_ms": self.first_seen_ms,
            "last_seen_ms": self.last_seen_ms,
            "last_entity": self.last_entity,
            "recent": list(self.recent),
            "verdicts": list(self.verdicts),
            "fixed_after_ms": self.fixed_after_ms,
        }
        text = json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=True)
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        return f"<!-- trace-repro:state {text} -->"

    @classmethod
    def parse(cls, description: str | None) -> IssueState | None:
        """The state of a description written by this module, or None (absent, or edited beyond recognition)."""
        found = _STATE.findall(description or "")
        if not found:
            return None
        try:
            d: dict[str, Any] = json.loads(found[-1])
            fixed = d.get("fixed_after_ms")
            return cls(
                fingerprint=str(d["fingerprint"]),
                occurrences=int(d["occurrences"]),
                manifest=int(d.get("manifest", 0)),
                first_seen_ms=float(d["first_seen_ms"]),
                last_seen_ms=float(d["last_seen_ms"]),
                last_entity=str(d.get("last_entity", "")),
                recent=tuple(str(x) for x in d.get("recent", [])),
                verdicts=tuple(str(x) for x in d.get("verdicts", [])),
                fixed_after_ms=None if fixed is None else float(fixed),
            )
        except (ValueError, KeyError, TypeError):
            return None


def occurrences_line(state: IssueState) -> str:
    return (
        f"**Occurrences:** {state.occurrences} ({state.manifest} manifest) · first seen {iso(state.first_seen_ms)}"
        f" · last seen {iso(state.last_seen_ms)} on {code(state.last_entity)}"
    )


def with_state(description: str, state: IssueState) -> str:
    """``description`` with its occurrences line and hidden state replaced by ``state`` (appended if missing)."""
    line = occurrences_line(state)
    if _OCCURRENCES.search(description):
        text = _OCCURRENCES.sub(lambda _: line, description, count=1)
    else:
        text = description.rstrip("\n") + "\n\n" + line + "\n"
    text = _STATE.sub("", text).rstrip("\n")
    return f"{text}\n\n{state.comment()}\n"


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


def _overview(e: IncidentEvent) -> list[str]:
    state = "manifest (the damage happened)" if e.manifest else "latent (the race happened, no damage seen yet)"
    return [
        "| | |",
        "|---|---|",
        f"| **Anomaly** | {anomaly_name(e.anomaly)} ({code(e.anomaly, cell=True)}) |",
        f"| **Severity** | {code(e.severity, cell=True)}: {state} |",
        f"| **Table** | {code(e.table, cell=True)} |",
        f"| **Entity** | {code(e.entity, cell=True)} |",
        f"| **Causal window** | {e.window_ms:.1f} ms |",
        f"| **Confidence** | {e.confidence:.2f} |",
        f"| **Fingerprint** | {code(e.fingerprint, cell=True)} |",
        f"| **First occurrence** | {code(e.occurrence, cell=True)}, judged at {iso(e.detected_at_unix_ms)} |",
    ]


def _writers(e: IncidentEvent) -> list[str]:
    lines = [
        "| Role | Function | File | Route | Lock | Statement | Parameters | Trace |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in e.writers:
        cells = [
            _role(w.trace_id, e),
            code(_who(w), cell=True),
            code(w.file, cell=True),
            code(w.route, cell=True),
            code(w.lock, cell=True),
            code(w.statement, cell=True),
            code(_params(w), cell=True, limit=120),
            code(w.trace_id[:8], cell=True),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _timeline(e: IncidentEvent) -> list[str]:
    rows: list[tuple[float, int, str]] = []
    for i, a in enumerate(e.accesses):
        cells = [_ms(a.offset_ms), _role(a.trace_id, e), a.operation, code(a.lock, cell=True),
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


def description(e: IncidentEvent, state: IssueState | None = None) -> str:
    """The issue description of the incident ``e`` (the occurrence that filed it)."""
    state = state or IssueState.first(e)
    damage = code(e.damage) if e.damage else "_None observed: the collision is latent._"
    parts = [
        f"## {anomaly_name(e.anomaly)} on {code(e.entity)}",
        "",
        f"> {code(e.summary, limit=400)}",
        "",
        *_overview(e),
        "",
        occurrences_line(state),
        "",
        "### Damage",
        "",
        damage,
        "",
        "### Writers",
        "",
        *_writers(e),
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
        "---",
        f"<sub>Filed by trace-repro · schema v{e.schema_version} · {code(fingerprint_label(e.fingerprint))}</sub>",
    ]
    return with_state("\n".join(parts), state)


# ---- notes ------------------------------------------------------------------------------------------------------


def occurrence_note(e: IncidentEvent, number: int, *, last: bool) -> str:
    """A note for a repeated occurrence (only the first few repeats get one)."""
    state = "manifest" if e.manifest else "latent"
    lines = [
        marker(event_id(e)),
        f"**Occurrence {number}** on {code(e.entity)} at {iso(e.culprit.start_unix_ms)}: {code(e.severity)} ({state}).",
        "",
        f"- culprit {code(_who(e.culprit))} ({code(e.culprit.route)}, build {code(e.culprit.version)})",
        f"- victim {code(_who(e.victim))} ({code(e.victim.route)}) at {_ms(e.victim.offset_ms)} ms",
        f"- damage: {code(e.damage) if e.damage else 'none observed'}",
    ]
    if last:
        lines += ["", "_Further occurrences only update the count in the description._"]
    return "\n".join(lines) + "\n"


def regression_note(e: IncidentEvent, fixed_after_ms: float | None) -> str:
    """The note that explains why a closed issue is reopened."""
    since = (
        f"it was verified fixed (verdict window from {iso(fixed_after_ms)})"
        if fixed_after_ms is not None
        else "the issue was closed"
    )
    return (
        f"{marker('regression-' + e.occurrence)}\n"
        f"### Regression\n\n"
        f"This defect happened again after {since}: occurrence {code(e.occurrence)} on {code(e.entity)} at "
        f"{iso(e.culprit.start_unix_ms)}, build {code(e.culprit.service)} {code(e.culprit.version)}.\n"
        f"Reopening.\n"
    )


def _run(status: str, duration_ms: float, failure: str) -> str:
    colour = {"failed": "RED", "passed": "GREEN"}.get(status, "ERROR")
    why = f": {code(failure, cell=True)}" if failure else ""
    return f"**{colour}** ({code(status, cell=True)}, {duration_ms:.1f} ms){why}"


def repro_note(e: ReproEvent, test_link: str, patch_link: str | None) -> str:
    """A reproduction: RED before the repair, GREEN after it, the divergence report, and the attachments."""
    verdict = "proven" if e.proven else "not proven"
    green = _run(e.green.status, e.green.duration_ms, e.green.failure) if e.green else "not run"
    d = e.divergence
    if d.faithful:
        divergence = "faithful: the test ran the statements production ran, in the same order"
    else:
        divergence = (
            f"diverged at statement {d.index if d.index is not None else '—'} ({code(d.mismatch or '?', cell=True)}): "
            f"expected {code(d.expected or '', cell=True)}, ran {code(d.actual or '', cell=True)}"
        )
    lines = [
        marker(event_id(e)),
        f"### Reproduction ({verdict})",
        "",
        "| | |",
        "|---|---|",
        f"| **Level** | {code(e.level, cell=True)} |",
        f"| **Test** | {code(e.test_path, cell=True)} |",
        f"| **Before the repair** | {_run(e.red.status, e.red.duration_ms, e.red.failure)} |",
        f"| **After the repair** | {green} |",
        f"| **Divergence** | {divergence} |",
        "",
    ]
    if e.repairs:
        lines += ["**Repairs**", ""]
        for r in e.repairs:
            lines.append(
                f"- {code(r.strategy)} in {code(r.function)} ({code(r.file)}): {code(r.statement_before)} → "
                f"{code(r.statement_after)} (lock {code(r.lock_before)} → {code(r.lock_after)})"
            )
        lines.append("")
    attachments = [test_link] + ([patch_link] if patch_link else [])
    lines.append("**Attachments:** " + " · ".join(one_line(a, 500) for a in attachments))
    return "\n".join(lines) + "\n"


def verdict_note(e: VerdictEvent) -> str:
    """A verdict with its receipt; a FIXED verdict also says that it closes the issue."""
    r = e.receipt
    interval = "—" if not r.interval else "[" + ", ".join(f"{x:.4g}" for x in r.interval) + "]"
    p_value = "—" if r.p_value is None else f"{r.p_value:.3g}"
    still = ", ".join(one_line(x, 80) for x in r.still_happens_at[:10]) or "—"
    lines = [
        marker(event_id(e)),
        f"### Verdict: **{code(e.outcome)}** for {code(e.service)} {code(e.version)} ({code(e.commit[:12])})",
        "",
        code(e.reason, limit=500),
        "",
        "| Receipt | |",
        "|---|---|",
        f"| Contract | {code(e.contract, cell=True)} |",
        f"| Before | {r.before_errors} errors / {r.before_requests} requests |",
        f"| After | {r.after_errors} errors / {r.after_requests} requests |",
        f"| Test | {code(r.test, cell=True)}, p = {p_value}, interval {interval} |",
        f"| Must-start requests seen | {r.must_start_seen} (needed {r.requests_needed}) |",
        f"| Still happens at | {code(still, cell=True)} |",
        f"| Window | {iso(r.window_start_unix_ms)} to {iso(r.window_end_unix_ms)} |",
        f"| Rollback recommended | {'yes' if e.rollback else 'no'} |",
    ]
    if e.outcome == "FIXED":
        lines += ["", "Closing: the defect stopped on this build. A new occurrence after the fix reopens the issue."]
    return "\n".join(lines) + "\n"


def duplicate_note(winner_iid: int) -> str:
    """The note on an issue closed because another instance filed the same fingerprint first."""
    return (
        f"{marker(f'duplicate-of-{winner_iid}')}\n"
        f"Closing as a duplicate of #{winner_iid}: another trace-repro instance filed the same fingerprint "
        "concurrently; the issue with the lowest number is kept.\n"
    )


def merge_request_note(mr_iid: int, branch: str) -> str:
    return f"{marker(f'merge-request-{branch}')}\nMerge request !{mr_iid} ({code(branch)}) proves this defect.\n"


def merge_request_description(e: ReproEvent, issue_iid: int, *, applied: bool, patch_path: str | None) -> str:
    """``Proves #N`` (never a closing keyword: only a FIXED verdict on the deployed build closes the issue)."""
    fix = (
        "the planned repair, applied to the changed files"
        if applied
        else f"the planned repair as a patch file {code(patch_path or '')} (it did not apply cleanly)"
    )
    return (
        f"Proves #{issue_iid}\n\n"
        f"This merge request adds the deterministic reproduction {code(e.test_path)} (RED before the repair) and "
        f"{fix}. The issue stays open until a FIXED verdict on the deployed build.\n"
    )


__all__ = [
    "ANOMALIES",
    "IssueState",
    "description",
    "duplicate_note",
    "event_id",
    "fingerprint_label",
    "marker",
    "merge_request_description",
    "merge_request_note",
    "mermaid",
    "occurrence_note",
    "regression_note",
    "repro_note",
    "title",
    "verdict_note",
    "with_state",
]
