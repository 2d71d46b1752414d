"""Markdown of the issue of a finding of any registered type: the generic GitLab body (registered for ``*``).

A detector that registers no body of its own gets this one: the title (its type's title and the finding's), what it
is about (service, operation, entity, build), its severity and remedy class, the rules of its proof contract, its
evidence lines, its typed ``data`` as a table, each ``series`` as a Mermaid ``xychart-beta`` line chart and its
example traces (linked to the trace UI). Pure functions of the finding, golden-file tested. Every untrusted string
(all of them: a finding's fields come from telemetry) is a code span in the Markdown,
:func:`~sinks.gitlab.escape.mermaid_string` in a chart and :func:`~sinks.gitlab.escape.plain` in the title. The
description ends with the hidden state of :mod:`sinks.gitlab.state`; every note starts with its marker.
"""

from __future__ import annotations

import json
from typing import Any

from processors.model.finding import FINDING_TYPES, ContractRules, FindingEvent, Series
from sinks.gitlab import charts
from sinks.gitlab.escape import code, mermaid_string, plain, title_text
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import closed_since, event_id, footer, iso, marker, reopen_id
from sinks.gitlab.state import IssueState, occurrences_line, with_state

MAX_DATA_ROWS = 40  # fields of ``data`` shown (the rest is in the event on Kafka and in the graph)
MAX_TRACES = 10


def type_title(e: FindingEvent) -> str:
    """Its registered type's title (``N+1 queries``), or the type's name made readable."""
    known = FINDING_TYPES.get(e.type)
    return known.title if known is not None else e.type.replace("_", " ").capitalize()


def _word(value: str) -> str:
    return plain(value, 80).replace("|", "\\|")


def anomaly(e: FindingEvent) -> str:
    """The class its issue is labelled with: its type."""
    return e.type


def title(e: FindingEvent) -> str:
    """``[trace-repro] <type title>: <finding title>`` (set once, when the issue is filed)."""
    return title_text(f"[trace-repro] {plain(type_title(e), 80)}: {plain(e.title)}")


def _overview(e: FindingEvent) -> list[str]:
    s = e.subject
    seen = iso(e.first_seen_unix_ms) + (f" to {iso(e.last_seen_unix_ms)}" if e.last_seen_unix_ms else "")
    return [
        "| | |",
        "|---|---|",
        f"| **Type** | {_word(type_title(e))} ({code(e.type, cell=True)}) |",
        f"| **Severity** | {code(e.severity, cell=True)} |",
        f"| **Remedy** | {code(e.remedy, cell=True)} |",
        f"| **Service** | {code(s.service, cell=True)} |",
        f"| **Operation** | {code(s.operation, cell=True)} |",
        f"| **Entity** | {code(s.entity, cell=True)} |",
        f"| **Build** | {code(s.version, cell=True)} |",
        f"| **Seen** | {seen} |",
        f"| **Fingerprint** | {code(e.fingerprint, cell=True)} |",
        f"| **First occurrence** | {code(e.occurrence, cell=True)}, detected at {iso(e.detected_at_unix_ms)} |",
    ]


def rules(contract: ContractRules | None) -> list[str]:
    """The proof contract's rules: what must stop, whose requests are the traffic, what must start."""
    if contract is None:
        return ["_No proof contract: this finding's type makes none._"]
    routes = ", ".join(code(r) for r in contract.routes) or "every route"
    lines = [
        f"- **Must stop:** {code(contract.signature)}",
        f"- **Traffic:** requests of {code(contract.service)} on {routes}",
    ]
    if contract.must_start:
        lines.append(f"- **Must start:** {code(contract.must_start)}")
    if contract.baseline_rate is not None:
        lines.append(f"- **Rate in this build:** {contract.baseline_rate:.3g} per request")
    return lines


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False, sort_keys=True)
    return code(text, cell=True, limit=200)


def data_table(e: FindingEvent) -> list[str]:
    """The typed data, one field a row (nested values as JSON)."""
    if not e.data:
        return ["_No data._"]
    items = sorted(e.data.items())
    lines = ["| Field | Value |", "|---|---|"]
    lines += [f"| {code(k, cell=True)} | {_value(v)} |" for k, v in items[:MAX_DATA_ROWS]]
    if len(items) > MAX_DATA_ROWS:
        lines.append(f"| … | {len(items) - MAX_DATA_ROWS} more fields |")
    return lines


def chart(series: Series) -> str:
    """One series as an ``xychart-beta`` line chart: its points' x as the categories, y from min(0, lowest)."""
    ys = [p.y for p in series.points]
    low = min([0.0, *ys])
    top = charts.ceiling(max(ys, default=0.0))
    return "\n".join(
        [
            "xychart-beta",
            f"    title {mermaid_string(series.name)}",
            f"    x-axis {mermaid_string(series.x_label, 60)} ["
            + ", ".join(f'"{charts.number(p.x)}"' for p in series.points)
            + "]",
            f"    y-axis {mermaid_string(series.y_label, 60)} {charts.number(low)} --> {charts.number(top)}",
            "    line [" + ", ".join(charts.number(y) for y in ys) + "]",
        ]
    )


def _charts(e: FindingEvent) -> list[str]:
    shown = [s for s in e.series if s.points]
    if not shown:
        return ["_No chart._"]
    out: list[str] = []
    for s in shown:
        out += [f"**Chart:** {code(s.name)}", "", "```mermaid", chart(s), "```", ""]
    return out[:-1]


def description(e: FindingEvent, state: IssueState | None = None, links: Links | None = None) -> str:
    """The issue description of the finding ``e`` (the occurrence that filed it)."""
    links = links or Links()
    state = state or IssueState.first(e)
    traces = [f"- {links.trace(t)}" for t in e.traces[:MAX_TRACES]] or ["_No example traces._"]
    parts = [
        f"## {_word(type_title(e))}: {code(e.title, limit=200)}",
        "",
        *_overview(e),
        "",
        occurrences_line(state),
        "",
        "### Proof contract rules",
        "",
        *rules(e.contract),
        "",
        "### Evidence",
        "",
        *(f"- {code(line, limit=400)}" for line in e.evidence),
        *([] if e.evidence else ["_No evidence lines._"]),
        "",
        "### Data",
        "",
        *data_table(e),
        "",
        "### Charts",
        "",
        *_charts(e),
        "",
        "### Example traces",
        "",
        *traces,
        "",
        *footer(e.fingerprint, e.schema_version),
    ]
    return with_state("\n".join(parts), state)


# ---- notes ------------------------------------------------------------------------------------------------------


def _at(e: FindingEvent) -> str:
    where = e.where()
    on = f" on {code(where)}" if where else ""
    return f"{code(e.type)}{on} at {iso(e.seen_unix_ms())}, build {code(e.subject.service)} {code(e.subject.version)}"


def occurrence_note(e: FindingEvent, number: int, *, last: bool, links: Links | None = None) -> str:
    """A note for a repeated occurrence (only the first few repeats get one)."""
    links = links or Links()
    lines = [marker(event_id(e)), f"**Occurrence {number}** of {_at(e)}: {code(e.severity)}.", "",
             f"> {code(e.title, limit=400)}", ""]  # fmt: skip
    lines += [f"- {code(line, limit=400)}" for line in e.evidence[:3]]
    lines += [f"- trace {links.trace(t)}" for t in e.traces[:3]]
    if last:
        lines += ["", "_Further occurrences only update the count in the description._"]
    return "\n".join(lines) + "\n"


def reopen_note(e: FindingEvent, fixed_after_ms: float | None) -> str:
    """The note that explains why a closed issue is reopened: the finding is back."""
    return (
        f"{marker(reopen_id(e))}\n"
        f"### Recurrence\n\n"
        f"This finding happened again after {closed_since(fixed_after_ms)}: occurrence {code(e.occurrence)} of "
        f"{_at(e)}.\n\n"
        f"> {code(e.title, limit=400)}\n\n"
        f"Reopening.\n"
    )


def upgrade_note(e: FindingEvent) -> str:
    """The note that says the description now shows a better-evidenced occurrence."""
    return (
        f"{marker(f'upgrade-{e.occurrence}')}\n"
        f"**Better evidence:** occurrence {code(e.occurrence)} of {_at(e)} replaces the one the description showed.\n"
    )


__all__ = [
    "anomaly",
    "chart",
    "data_table",
    "description",
    "occurrence_note",
    "reopen_note",
    "rules",
    "title",
    "type_title",
    "upgrade_note",
]
