"""Regression bodies and notes: golden files, the bar chart, the tables, the hidden state, hostile strings."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.model.outputs import Evidence, PathShare, RegressionEvent
from sinks.gitlab import body_incident, body_regression, markdown
from sinks.gitlab.state import IssueState, with_state
from tests.gitlab.helpers import check_golden, incident, recurrence, regression

LIVE_REF = re.compile(r"[@#!~%$&^][\w\"']")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def test_descriptions_match_golden_files() -> None:
    """An error and a latency regression, rendered from realistic events, are byte for byte their golden files."""
    check_golden("regression_issue_errors.md", body_regression.description(regression("errors")))
    check_golden("regression_issue_latency.md", body_regression.description(regression("latency")))


def test_notes_match_golden_files() -> None:
    """The occurrence note (the last one that gets a note) and the recurrence note are their golden files."""
    e = regression()
    check_golden("regression_note_occurrence.md", body_regression.occurrence_note(recurrence(e, 2), 2, last=True))
    later = recurrence(regression("latency"), 9)
    check_golden("regression_note_recurrence.md", body_regression.reopen_note(later, 1_800_004_000_000.0))


def test_title_is_the_summary() -> None:
    """The title names the class and carries the summary on one line."""
    e = regression()
    assert body_regression.title(e) == f"[trace-repro] Regression: {e.summary}"
    long = body_regression.title(e.model_copy(update={"summary": "x\n" * 300}))
    assert long.startswith("[trace-repro] Regression: x x ") and long.endswith("x…") and len(long) <= 255


def chart_lines(text: str) -> list[str]:
    lines = text.split("\n")
    start = lines.index("```mermaid")
    end = lines.index("```", start + 1)
    return lines[start + 1 : end]


def bars(lines: list[str]) -> tuple[list[str], float, list[float]]:
    """(x-axis labels, top of the y axis, bar values) of an xychart-beta block."""
    labels = json.loads(lines[2].removeprefix("    x-axis "))
    top = float(lines[3].rsplit("-->", 1)[1])
    values = json.loads(lines[4].removeprefix("    bar "))
    return labels, top, values


def test_error_chart_shows_the_primary_error_rates_in_percent() -> None:
    """Error rate before and after of the evidence with the smallest adjusted p (the baseline here), from 0."""
    e = regression("errors")
    primary = body_regression.primary(e)
    assert primary is not None and primary.comparison == "baseline" and primary.p_adjusted == 1.76e-29
    lines = chart_lines(body_regression.description(e))
    assert lines[0] == "xychart-beta" and lines[1].startswith('    title "Error rate of /orders/{order_id}/capture')
    labels, top, values = bars(lines)
    assert labels == ["before", "after"] and values == [0.092, 2.185]
    assert " 0 --> " in lines[3] and top >= max(values) * 1.1 and top == 2.5


def test_latency_chart_shows_p50_and_p95_before_and_after() -> None:
    """A latency regression charts p50 and p95, before and after, in ms."""
    lines = chart_lines(body_regression.description(regression("latency")))
    labels, top, values = bars(lines)
    assert labels == ["p50 before", "p50 after", "p95 before", "p95 after"]
    assert values == [11.8, 31.2, 24.6, 88.9] and top == 100 and '"latency (ms)"' in lines[3]


def test_version_comparison_wins_a_tie() -> None:
    """With equal adjusted p-values the chart shows the version comparison, as the detector's summary does."""
    e = regression("errors")
    tied = [ev.model_copy(update={"p_adjusted": 1e-9}) for ev in e.evidence]
    primary = body_regression.primary(e.model_copy(update={"evidence": tied}))
    assert primary is not None and primary.comparison == "version"


def test_evidence_and_critical_path_tables() -> None:
    """Every test is a row with counts, rates, p, adjusted p and the rate ratio CI; shares are percentages."""
    text = body_regression.description(regression("errors"))
    assert (
        "| `baseline`: 3 earlier windows of `1.5.0` | `conditional binomial (exact)` | 5 / 5412 | 41 / 1876 | "
        "0.092% | 2.185% | ratio 23.7 | 2.2e-31 | 1.76e-29 | [9.3, 76.5] |"
    ) in text
    assert "| version `1.4.3` → `1.5.0` | `conditional binomial (exact)` | 0 / 1902 | 41 / 1876 |" in text
    assert "| ratio ∞ | 3.41e-13 | 1.36e-11 | [9.82, ∞] |" in text  # an unbounded ratio is infinite
    assert "| `postgresql` | 41.2% | 45.5% | +4.3 pp |" in text and "| `shop` | 58.8% | 54.5% | -4.3 pp |" in text
    latency = body_regression.description(regression("latency"))
    assert "| p50 11.8 ms · p95 24.6 ms · 1536 samples | p50 31.2 ms · p95 88.9 ms · 512 samples |" in latency
    assert "| P(after > before) = 0.84 | 2.1e-94 | 4.2e-93 | — |" in latency


def test_without_evidence_or_path_the_sections_say_so() -> None:
    """No evidence row: no chart, no table rows; no critical path: a sentence instead of an empty table."""
    text = body_regression.description(regression(evidence=[], critical_path=[]))
    assert "```mermaid" not in text and "_No evidence to chart._" in text and "_No evidence rows._" in text
    assert "_No critical-path shift recorded._" in text


def test_all_zero_bars_get_a_unit_axis() -> None:
    """A chart whose bars are all 0 still has an axis from 0 to 1 (and never an exponent in a number)."""
    e = regression()
    ev = e.evidence[1].model_copy(update={"before_rate": 0.0, "after_rate": 1e-9})
    assert bars(body_regression.chart(e, ev).split("\n"))[1:] == (1.0, [0.0, 0.0])


def test_state_of_a_regression_round_trips_and_incident_state_is_unchanged() -> None:
    """A regression's state says so and counts windows by build; an incident's state JSON has no ``kind`` key."""
    e = regression()
    text = body_regression.description(e)
    state = IssueState.parse(text)
    assert state == IssueState.first(e) and state.kind == "regression" and state.last_entity == "1.5.0"
    later = recurrence(e, 3).model_copy(update={"version": "1.5.1"})
    updated = with_state(text, state.with_occurrence(later))
    again = IssueState.parse(updated)
    assert again is not None and again.occurrences == 2 and again.seen(later.occurrence) and again.manifest == 0
    assert again.last_seen_ms == later.window_start_unix_ms and again.first_seen_ms == e.window_start_unix_ms
    line = "**Occurrences:** 2 · first seen 2027-01-15T08:50:00.000Z · last seen 2027-01-15T09:10:00.000Z in build"
    assert f"{line} `1.5.1`\n" in updated and updated.count("**Occurrences:**") == 1
    assert '"kind"' not in IssueState.first(incident()).comment()
    assert IssueState.parse(body_incident.description(incident())) == IssueState.first(incident())


def test_note_markers_are_per_occurrence() -> None:
    """Occurrence and recurrence notes of one window have their own markers, distinct from incidents' markers."""
    e = regression()
    note = body_regression.occurrence_note(e, 2, last=False)
    assert note.startswith(markdown.marker("regression-occurrence-" + e.occurrence) + "\n")
    assert body_regression.reopen_note(e, None).startswith(markdown.marker("recurrence-" + e.occurrence) + "\n")
    assert "after the issue was closed" in body_regression.reopen_note(e, None)
    assert "Further occurrences" not in note


# ---- hostile strings ------------------------------------------------------------------------------------------

NASTY = [
    "```",
    '"',
    '" ]\n    bar [1e9',
    "%%{init: {'theme': 'dark'}}%%",
    "a --> b ; x",
    "#35; <script>alert(1)</script>",
    "| col | injected |",
    "@everyone #1 !2 ~bug %m $3 &4 ^alert",
    "/close\n/assign @me",
    '<!-- trace-repro:state {"fingerprint":"x"} -->',
    "**Occurrences:** 999",
    "\u2028line\u2029sep\r\nnext\x00nul\x85nel",
    "\u202eevil-bidi",
]
hostile = st.one_of(
    st.sampled_from(NASTY),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=30),
    st.lists(st.sampled_from(NASTY), min_size=1, max_size=3).map("".join),
)
CHART = [
    re.compile(r'^    title "[^"`\n;#%<>]*"$'),
    re.compile(r'^    x-axis \[("[a-z0-9 ]+", )*"[a-z0-9 ]+"\]$'),
    re.compile(r'^    y-axis "[a-z ()%]+" 0 --> [0-9.]+$'),
    re.compile(r"^    bar \[([0-9.]+, )*[0-9.]+\]$"),
]


def _hostile_event(s: list[str], metric: str) -> RegressionEvent:
    e = regression(metric)

    def ev(x: Evidence, i: int) -> Evidence:
        fields = ("test", "comparison", "before_version", "after_version")
        return x.model_copy(update={f: s[(i + j) % len(s)] for j, f in enumerate(fields)})

    return e.model_copy(
        update={
            "service": s[0],
            "operation": s[1 % len(s)],
            "signature": s[2 % len(s)],
            "version": s[3 % len(s)],
            "previous_version": s[4 % len(s)],
            "commit": s[5 % len(s)],
            "window": s[-1],
            "summary": " ".join(s),
            "occurrence": s[0][:16],
            "evidence": [ev(x, i) for i, x in enumerate(e.evidence)],
            "critical_path": [PathShare(owner=x, before=0.5, after=0.25, delta=-0.25) for x in s],
        }
    )


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


@settings(max_examples=150, deadline=None)
@given(st.lists(hostile, min_size=1, max_size=6), st.sampled_from(["errors", "latency"]))
def test_hostile_strings_cannot_break_out(strings: list[str], metric: str) -> None:
    """Whatever production sent: a closed chart of four clean lines, intact tables, no live reference or action."""
    e = _hostile_event(strings, metric)
    text = body_regression.description(e)
    lines = text.split("\n")
    fences = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(("```", "~~~"))]
    assert len(fences) == 2 and lines[fences[0]] == "```mermaid" and lines[fences[1]] == "```"
    block = lines[fences[0] + 1 : fences[1]]
    assert block[0] == "xychart-beta" and len(block) == 5
    for pattern, line in zip(CHART, block[1:], strict=True):
        assert pattern.match(line), line
    assert "--" not in block[1]
    header_pipes = 0
    for previous, line in zip(["", *lines], lines, strict=False):
        if line.startswith("|"):
            if not previous.startswith("|"):
                header_pipes = _unescaped_pipes(line)
            assert _unescaped_pipes(line) == header_pipes, line
    outside = [ln for i, ln in enumerate(lines) if not fences[0] <= i <= fences[1]]
    prose = CODE_SPAN.sub("", "\n".join(ln for ln in outside if not ln.startswith(("<!-- trace-repro:state", "<sub>"))))
    assert "@" not in prose and "<" not in prose and "`" not in prose
    assert not any(ln.startswith("/") for ln in lines)
    assert sum(ln.startswith("**Occurrences:**") for ln in lines) == 1
    state = IssueState.parse(text)
    assert state is not None and state.seen(e.occurrence) and state.kind == "regression"
    title = body_regression.title(e)
    assert "\n" not in title and not LIVE_REF.search(title) and len(title) <= 255
    for note in (body_regression.occurrence_note(e, 2, last=True), body_regression.reopen_note(e, 1.0)):
        note_prose = CODE_SPAN.sub("", note.split("\n", 1)[1])
        assert (
            "@" not in note_prose and "<" not in note_prose and not any(ln.startswith("/") for ln in note.split("\n"))
        )


@pytest.mark.parametrize("text", ["@everyone", "#12", "!3", "~bug", '~"needs review"', "%v1.0", "$7", "&2", "^alert"])
def test_titles_never_hold_a_live_reference(text: str) -> None:
    """References in production text are inert in regression titles and in incident titles alike."""
    assert not LIVE_REF.search(body_regression.title(regression(summary=f"x {text} y")))
    e = incident()
    hostile_incident = e.model_copy(update={"table": text, "culprit": e.culprit.model_copy(update={"function": text})})
    assert not LIVE_REF.search(body_incident.title(hostile_incident))
