"""Markdown of what a reproduction adds: its note (RED, GREEN, divergence, the evidence packet's summary and what the
reduction removed, attachments) and its merge request.

The merge request says ``Proves #N``, never a closing keyword: only a FIXED verdict on the deployed build closes
the issue. Untrusted strings are code spans (:mod:`sinks.gitlab.escape`); the note starts with its marker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from processors.model.contract import ProofContract
from processors.model.outputs import ReproEvent
from sinks.gitlab import ci_job
from sinks.gitlab.escape import code, one_line, plain, title_text
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import event_id, marker

_SHOWN = {"psycopg", "psycopg2", "psycopg2-binary", "asyncpg", "sqlalchemy", "django", "pytest"}
_SIDECAR = "evidence.json"
_LISTED = 5


def _run(status: str, duration_ms: float, failure: str) -> str:
    colour = {"failed": "RED", "passed": "GREEN"}.get(status, "ERROR")
    why = f": {code(failure, cell=True)}" if failure else ""
    return f"**{colour}** ({code(status, cell=True)}, {duration_ms:.1f} ms){why}"


def _evidence_rows(evidence: Mapping[str, Any]) -> list[str]:
    """The evidence packet's summary as table rows: the reduction, what the repro was made and run with, production's
    services; none for a repro published without a packet."""
    if not evidence:
        return []
    r = evidence.get("reduction") or {}
    steps, rows = r.get("steps") or {}, r.get("rows") or {}
    if r.get("shipped") == "reduced":
        reduced = (f"{steps.get('kept')} of {steps.get('full')} steps, {rows.get('kept')} of {rows.get('full')} seed "
                   f"rows, each candidate run on the scratch database ({r.get('runs')} runs)")  # fmt: skip
        if r.get("full_test"):
            reduced += f"; the full repro is {code(r['full_test'], cell=True)}"
    else:
        reduced = "not reduced" + (f": {code(r.get('why'), cell=True)}" if r.get("why") else " (nothing could go)")
    if r.get("stopped_by"):
        reduced += f"; stopped by {code(r['stopped_by'], cell=True)}"
    packages = evidence.get("packages") or {}
    made = [f"Python {code((evidence.get('python') or {}).get('version'), cell=True)}"]
    made += [f"{code(name, cell=True)} {code(v, cell=True)}" for name, v in sorted(packages.items())
             if name.lower() in _SHOWN]  # fmt: skip
    made += [f"PostgreSQL {code((evidence.get('postgresql') or {}).get('repro_server') or '?', cell=True)}",
             f"trace-repro {code(evidence.get('trace_repro'), cell=True)}"]  # fmt: skip
    traces = (evidence.get("production") or {}).get("traces") or []
    services = sorted({f"{t.get('service')} {t.get('version') or '(no service.version)'}" for t in traces})
    return [
        f"| **Reduced** | {reduced} |",
        f"| **Made and run with** | {', '.join(made)} |",
        f"| **Production** | {', '.join(code(s, cell=True) for s in services) or '—'} |",
        f"| **Evidence** | {code(_SIDECAR, cell=True)} beside the test, and {code('EVIDENCE', cell=True)} at its end |",
    ]


def _removed(evidence: Mapping[str, Any]) -> list[str]:
    """The statements and seed rows the reduction removed (the first few), as code spans."""
    r = (evidence or {}).get("reduction") or {}
    if r.get("shipped") != "reduced":
        return []
    steps, rows = r.get("removed_steps") or [], r.get("removed_rows") or []
    lines = [f"**Removed by the reduction** ({len(steps)} statements, {len(rows)} seed rows)", ""]
    for s in steps[:_LISTED]:
        lines.append(f"- session {code(s.get('session'))}: {code(s.get('statement'))} {code(s.get('params'))}")
    lines += [f"- seed row {code(row)}" for row in rows[:_LISTED]]
    if len(steps) > _LISTED or len(rows) > _LISTED:
        lines.append("- … (all of them in the evidence packet)")
    return [*lines, ""]


def repro_note(e: ReproEvent, test_link: str, patch_link: str | None, links: Links | None = None) -> str:
    """A reproduction: RED before the repair, GREEN after it, the divergence report, and the attachments (a repaired
    file's path relative to the repository, as ``links`` makes it)."""
    links = links or Links()
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
        *_evidence_rows(e.evidence),
        "",
    ]
    lines += _removed(e.evidence)
    if e.redacted:
        lines += ["Built from redacted values: the test replays their placeholders (`[REDACTED]`, `[HMAC:…]`), not "
                  "production's; where the defect depends on them, RED and GREEN do not prove it.", ""]  # fmt: skip
    if e.repairs:
        lines += ["**Repairs**", ""]
        for r in e.repairs:
            lines.append(
                f"- {code(r.strategy)} in {code(r.function)} ({code(links.relative(r.file))}): "
                f"{code(r.statement_before)} → {code(r.statement_after)} "
                f"(lock {code(r.lock_before)} → {code(r.lock_after)})"
            )
        lines.append("")
    attachments = [test_link] + ([patch_link] if patch_link else [])
    lines.append("**Attachments:** " + " · ".join(one_line(a, 500) for a in attachments))
    return "\n".join(lines) + "\n"


def merge_request_title(e: ReproEvent, issue_iid: int) -> str:
    """``Prove #N: <test path>`` (the reference to the issue is ours; the path cannot add one)."""
    return title_text(f"Prove #{issue_iid}: {plain(e.test_path)}")


def merge_request_note(mr_iid: int, branch: str) -> str:
    """The note on the issue that links the merge request proving it."""
    return f"{marker(f'merge-request-{branch}')}\nMerge request !{mr_iid} ({code(branch)}) proves this defect.\n"


@dataclass(frozen=True, slots=True)
class GateSetup:
    """How the merge request runs the gate: the CI configuration, whether it includes the job, the contract path."""

    ci_path: str
    included: bool
    contract: str
    committed: ProofContract | None = None  # the issue's contract, committed at ``contract``
    proof_job: str = ""  # the incident's proof job file, when committed


def _gate(e: ReproEvent, issue_iid: int, gate: GateSetup) -> list[str]:
    if gate.included:
        runs = f"{code(ci_job.GATE_JOB_PATH)}, included by {code(gate.ci_path)}"
    else:
        runs = (f"{code(ci_job.GATE_JOB_PATH)}; {code(gate.ci_path)} could not be edited safely, so add "
                f"{code(f'- local: {ci_job.GATE_JOB_PATH}')} to its {code('include:')} list")  # fmt: skip
    if gate.committed is not None and gate.committed.must_start:
        c = gate.committed
        job = code(f"trace-repro-proof-{issue_iid}")
        proof = (f" The job {job} ({code(gate.proof_job)}) runs the reproduction against a PostgreSQL service; the "
                 "gate judges its JUnit report.") if gate.proof_job else ""  # fmt: skip
        return [
            "### Gate",
            "",
            f"The job {code('trace-repro-gate')} ({runs}) runs {code('trace-repro gate')} in this merge request's "
            f"pipelines on the proof contract of #{issue_iid}, committed as {code(gate.contract)} from the issue's "
            f"*Proof contract* section: must stop {code(c.signature)}, must start {code(c.must_start)} (the repaired "
            f"code emits it, and a test asserts it), watched for {c.watch_s:g} s.{proof}",
        ]
    command = (f"trace-repro contract add --fingerprint {e.fingerprint} --signature <signature> "
               f"--must-start <event> --issue {issue_iid} --write {gate.contract}")  # fmt: skip
    return [
        "### Gate",
        "",
        f"The job {code('trace-repro-gate')} ({runs}) runs {code('trace-repro gate')} in this merge request's "
        f"pipelines: the tests it adds must pass, and the proof contract {code(gate.contract)} must hold: a change "
        "that emits the contract's must-start event and a test that asserts it. Write the contract (and publish it "
        f"for the proof judge) with {code(command, limit=500)}, commit it here, and emit the event in the fix.",
    ]


def merge_request_description(e: ReproEvent, issue_iid: int, *, applied: bool, patch_path: str | None,
                              gate: GateSetup | None = None) -> str:  # fmt: skip
    """``Proves #N`` (never a closing keyword: only a FIXED verdict on the deployed build closes the issue), what the
    merge request adds, and how its pipeline runs the gate."""
    fix = (
        "the planned repair, applied to the changed files"
        if applied
        else f"the planned repair as a patch file {code(patch_path or '')} (it did not apply cleanly)"
    )
    lines = [
        f"Proves #{issue_iid}",
        "",
        f"This merge request adds the deterministic reproduction {code(e.test_path)} (RED before the repair) and "
        f"{fix}. The issue stays open until a FIXED verdict on the deployed build.",
    ]
    if gate is not None:
        lines += ["", *_gate(e, issue_iid, gate)]
    return "\n".join(lines) + "\n"


__all__ = ["GateSetup", "merge_request_description", "merge_request_note", "merge_request_title", "repro_note"]
