"""Markdown of a verdict's note: the outcome on a deployed build and the receipt behind it.

A FIXED verdict's note also says that it closes the issue (the sink closes it). Untrusted strings are code spans
(:mod:`sinks.gitlab.escape`); the note starts with its marker.
"""

from __future__ import annotations

from processors.model.outputs import VerdictEvent
from sinks.gitlab.escape import code, one_line
from sinks.gitlab.markdown import event_id, iso, marker


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
    if r.build_identified_by:  # how the build was told apart: version, commit, digest or a deploy mark
        lines.append(f"| Build identified by | {code(r.build_identified_by, cell=True)} |")
    if e.outcome == "FIXED":
        lines += ["", "Closing: the defect stopped on this build. A new occurrence after the fix reopens the issue."]
    return "\n".join(lines) + "\n"


__all__ = ["verdict_note"]
