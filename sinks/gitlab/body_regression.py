"""Markdown of a regression's issue: its title, its description with a Mermaid bar chart, and its notes.

The description says what regressed (service, operation, signature, metric, versions, commit, window), shows
the *primary* evidence (the test the summary names: the smallest Benjamini-Hochberg-adjusted p-value, the
version comparison on a tie) as an ``xychart-beta`` bar chart (the error rate in % before and after, or the
latency p50 and p95 in ms before and after; the y axis starts at 0 so that bar heights compare), lists every
test in the evidence table (counts, rates, effect, p-value, adjusted p, exact 95% CI of the rate ratio; a bound
of ``None`` is infinite) and the critical-path shares of the slowest requests, before and after.

Pure functions of the events, golden-file tested. Untrusted strings (operation, signature, versions, owners,
the summary) are code spans in the Markdown, :func:`~sinks.gitlab.escape.mermaid_string` in the chart and
:func:`~sinks.gitlab.escape.plain` in the title. The description ends with the hidden state of
:mod:`sinks.gitlab.state`; every note starts with the marker of :mod:`sinks.gitlab.markdown`.
"""

from __future__ import annotations

from processors.model.anomaly import Anomaly
from processors.model.outputs import Evidence, RegressionEvent
from sinks.gitlab import charts
from sinks.gitlab.escape import code, mermaid_string, plain, title_text
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import closed_since, event_id, footer, iso, marker, reopen_id
from sinks.gitlab.state import IssueState, occurrences_line, with_state


def anomaly(e: RegressionEvent) -> str:
    """The class its issue is labelled with: ``regression``, whatever the metric."""
    return Anomaly.REGRESSION.value


def title(e: RegressionEvent) -> str:
    """``[trace-repro] Regression: <summary>`` (set once, when the issue is filed)."""
    return title_text(f"[trace-repro] {Anomaly.REGRESSION.label}: {plain(e.summary)}")


def primary(e: RegressionEvent) -> Evidence | None:
    """The evidence the summary names: the smallest adjusted p-value, the version comparison on a tie."""
    if not e.evidence:
        return None
    return min(e.evidence, key=lambda ev: (ev.p_adjusted, ev.comparison != "version"))


def _latency(e: RegressionEvent) -> bool:
    return e.metric == "latency"


def _before(ev: Evidence) -> str:
    if ev.comparison == "version":
        return f"{ev.before_version} (previous version)"
    return f"{ev.before_version} ({len(ev.before_windows)} earlier windows)"


def _rate(rate: float) -> str:
    return f"{rate * 100:.3f}%"


def _p(value: float) -> str:
    return f"{value:.3g}"


def _bound(value: float | None) -> str:
    return "∞" if value is None else f"{value:.3g}"


def _change(e: RegressionEvent, ev: Evidence) -> str:
    """One line: the primary numbers before and after, and the test's p-values."""
    if _latency(e):
        moved = (
            f"p50 {ev.before_p50_ms:.1f} → {ev.after_p50_ms:.1f} ms, p95 {ev.before_p95_ms:.1f} → "
            f"{ev.after_p95_ms:.1f} ms"
        )
    else:
        moved = (
            f"error rate {_rate(ev.before_rate)} ({ev.before_errors} / {ev.before_requests}) → "
            f"{_rate(ev.after_rate)} ({ev.after_errors} / {ev.after_requests})"
        )
    return f"{moved} against {code(_before(ev))}: {code(ev.test)} p = {_p(ev.p_value)}, BH-adjusted {_p(ev.p_adjusted)}"


# ---- the chart --------------------------------------------------------------------------------------------------


def chart(e: RegressionEvent, ev: Evidence) -> str:
    """The primary evidence as an ``xychart-beta`` bar chart: error rate, or latency p50 and p95, before vs after."""
    versus = f"{_before(ev)} vs {ev.after_version}"
    if _latency(e):
        heading = f"Latency of {e.operation}, ms: {versus}"
        labels = ["p50 before", "p50 after", "p95 before", "p95 after"]
        values = [ev.before_p50_ms, ev.after_p50_ms, ev.before_p95_ms, ev.after_p95_ms]
        axis = "latency (ms)"
    else:
        heading = f"Error rate of {e.operation}, percent: {versus}"
        labels = ["before", "after"]
        values = [ev.before_rate * 100, ev.after_rate * 100]
        axis = "error rate (%)"
    shown = [charts.number(v) for v in values]
    return "\n".join(
        [
            "xychart-beta",
            f"    title {mermaid_string(heading)}",
            "    x-axis [" + ", ".join(f'"{label}"' for label in labels) + "]",
            f'    y-axis "{axis}" 0 --> {charts.number(charts.ceiling(max(float(v) for v in shown)))}',
            "    bar [" + ", ".join(shown) + "]",
        ]
    )


# ---- the issue description --------------------------------------------------------------------------------------


def _overview(e: RegressionEvent) -> list[str]:
    metric = "latency" if _latency(e) else "error rate"
    previous = code(e.previous_version, cell=True) if e.previous_version else "none: flagged against earlier windows"
    return [
        "| | |",
        "|---|---|",
        f"| **Service** | {code(e.service, cell=True)} |",
        f"| **Operation** | {code(e.operation, cell=True)} |",
        f"| **Signature** | {code(e.signature, cell=True)} |",
        f"| **Metric** | {metric} ({code(e.metric, cell=True)}) |",
        f"| **Version** | {code(e.version, cell=True)}, commit {code(e.commit, cell=True)} |",
        f"| **Previous version** | {previous} |",
        f"| **Window** | {code(e.window, cell=True)}: {iso(e.window_start_unix_ms)} to {iso(e.window_end_unix_ms)} |",
        f"| **Fingerprint** | {code(e.fingerprint, cell=True)} |",
        f"| **First occurrence** | {code(e.occurrence, cell=True)}, detected at {iso(e.detected_at_unix_ms)} |",
    ]


def _comparison(ev: Evidence) -> str:
    if ev.comparison == "version":
        return f"version {code(ev.before_version, cell=True)} → {code(ev.after_version, cell=True)}"
    windows = len(ev.before_windows)
    return f"{code(ev.comparison, cell=True)}: {windows} earlier windows of {code(ev.before_version, cell=True)}"


def _side(e: RegressionEvent, errors: int, requests: int, p50: float, p95: float, samples: int) -> str:
    if _latency(e):
        return f"p50 {p50:.1f} ms · p95 {p95:.1f} ms · {samples} samples"
    return f"{errors} / {requests}"


def _effect(e: RegressionEvent, ev: Evidence) -> str:
    if _latency(e):
        return "—" if ev.effect is None else f"P(after > before) = {ev.effect:.2f}"
    return f"ratio {_bound(ev.effect)}"


def _interval(e: RegressionEvent, ev: Evidence) -> str:
    if _latency(e) or (ev.ratio_low is None and ev.ratio_high is None):
        return "—"
    return f"[{_bound(ev.ratio_low)}, {_bound(ev.ratio_high)}]"


def evidence_table(e: RegressionEvent) -> list[str]:
    """Every test that flagged the regression, with the numbers it ran on."""
    if not e.evidence:
        return ["_No evidence rows._"]
    lines = [
        "| Comparison | Test | Before | After | Error rate before | Error rate after | Effect | p-value "
        "| BH-adjusted p | Rate ratio, 95% CI |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|",
    ]
    for ev in e.evidence:
        cells = [
            _comparison(ev),
            code(ev.test, cell=True),
            _side(e, ev.before_errors, ev.before_requests, ev.before_p50_ms, ev.before_p95_ms, ev.before_samples),
            _side(e, ev.after_errors, ev.after_requests, ev.after_p50_ms, ev.after_p95_ms, ev.after_samples),
            _rate(ev.before_rate),
            _rate(ev.after_rate),
            _effect(e, ev),
            _p(ev.p_value),
            _p(ev.p_adjusted),
            _interval(e, ev),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def path_table(e: RegressionEvent) -> list[str]:
    """Each owner's share of the slowest requests' critical path, before and after (largest moves first)."""
    if not e.critical_path:
        return ["_No critical-path shift recorded._"]
    lines = ["| Owner | Before | After | Delta |", "|---|---:|---:|---:|"]
    for s in e.critical_path:
        lines.append(
            f"| {code(s.owner, cell=True)} | {s.before * 100:.1f}% | {s.after * 100:.1f}% | {s.delta * 100:+.1f} pp |"
        )
    return lines


def description(e: RegressionEvent, state: IssueState | None = None, links: Links | None = None) -> str:
    """The issue description of the regression ``e`` (the occurrence that filed it; it links nothing)."""
    state = state or IssueState.first(e)
    ev = primary(e)
    shown = ["```mermaid", chart(e, ev), "```"] if ev is not None else ["_No evidence to chart._"]
    parts = [
        f"## {'Latency' if _latency(e) else 'Error'} regression of {code(e.operation)} on {code(e.service)}",
        "",
        f"> {code(e.summary, limit=400)}",
        "",
        *_overview(e),
        "",
        occurrences_line(state),
        "",
        "### Before and after",
        "",
        *shown,
        "",
        "### Evidence",
        "",
        *evidence_table(e),
        "",
        "### Critical path",
        "",
        "Share of the slowest requests' critical path owned by each service or database.",
        "",
        *path_table(e),
        "",
        *footer(e.fingerprint, e.schema_version),
    ]
    return with_state("\n".join(parts), state)


# ---- notes ------------------------------------------------------------------------------------------------------


def _where(e: RegressionEvent) -> str:
    return (
        f"in window {code(e.window)} ({iso(e.window_start_unix_ms)} to {iso(e.window_end_unix_ms)}), build "
        f"{code(e.service)} {code(e.version)} (commit {code(e.commit[:12])})"
    )


def occurrence_note(e: RegressionEvent, number: int, *, last: bool, links: Links | None = None) -> str:
    """A note for a repeated occurrence (only the first few repeats get one)."""
    ev = primary(e)
    lines = [
        marker(event_id(e)),
        f"**Occurrence {number}** {_where(e)}.",
        "",
        f"> {code(e.summary, limit=400)}",
    ]
    if ev is not None:
        lines += ["", f"- {_change(e, ev)}"]
    if last:
        lines += ["", "_Further occurrences only update the count in the description._"]
    return "\n".join(lines) + "\n"


def reopen_note(e: RegressionEvent, fixed_after_ms: float | None) -> str:
    """The note that explains why a closed issue is reopened: the regression is back."""
    return (
        f"{marker(reopen_id(e))}\n"
        f"### Recurrence\n\n"
        f"This regression happened again after {closed_since(fixed_after_ms)}: occurrence {code(e.occurrence)} "
        f"{_where(e)}.\n\n"
        f"> {code(e.summary, limit=400)}\n\n"
        f"Reopening.\n"
    )


def upgrade_note(e: RegressionEvent) -> str:
    """Never posted (regressions are not ranked, so no occurrence is better evidenced): the occurrence's line."""
    return f"{marker(f'upgrade-{e.occurrence}')}\n**Occurrence** {_where(e)}.\n"


__all__ = [
    "anomaly",
    "chart",
    "description",
    "evidence_table",
    "occurrence_note",
    "path_table",
    "primary",
    "reopen_note",
    "title",
    "upgrade_note",
]
