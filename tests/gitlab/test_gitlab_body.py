"""Incident, repro and verdict bodies and notes: golden files, the hidden state, hostile strings (hypothesis)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.model.outputs import IncidentEvent
from sinks.gitlab import body_incident, body_repro, body_verdict, markdown
from sinks.gitlab.state import IssueState, with_state
from tests.gitlab.helpers import LINKS, built_at, check_golden, incident, occurrence, repro, verdict


@pytest.mark.parametrize("name", ["lost_update", "invariant_violation", "duplicate_apply"])
def test_issue_description_matches_golden_file(name: str) -> None:
    """The description of each anomaly class, rendered from a realistic event, is byte-for-byte the golden file: the
    lost update with links configured and the build machine's absolute paths (whole trace ids linked to the trace UI,
    files relative to the source root and linked at the build's version), the others without (whole ids, no link)."""
    if name == "lost_update":
        check_golden(
            f"issue_{name}.md", body_incident.description(built_at(incident(name), "/builds/shop"), links=LINKS)
        )
    else:
        check_golden(f"issue_{name}.md", body_incident.description(incident(name)))


def test_notes_match_golden_files() -> None:
    """Occurrence, regression, reproduction, verdict and duplicate notes are byte-for-byte their golden files."""
    e = incident()
    check_golden("note_occurrence.md", body_incident.occurrence_note(occurrence(e, 2), 2, last=False, links=LINKS))
    check_golden(
        "note_regression.md",
        body_incident.reopen_note(occurrence(e, 9, at_ms=1_800_000_700_000.0), 1_800_000_600_000.0),
    )
    check_golden(
        "note_repro.md", body_repro.repro_note(repro(), "[t.py](/uploads/a/t.py)", "[p.patch](/uploads/b/p.patch)")
    )
    check_golden("note_verdict.md", body_verdict.verdict_note(verdict()))
    check_golden("note_duplicate.md", markdown.duplicate_note(1))


def test_title_is_stable_per_fingerprint() -> None:
    """The title names the anomaly, the table and both code paths, and does not change between occurrences."""
    e = incident()
    assert body_incident.title(e) == (
        "[trace-repro] Lost update on orders: shop.jobs.expire_cart vs shop.handlers.capture_payment"
    )
    assert body_incident.title(occurrence(e, 3)) == body_incident.title(e)
    assert body_incident.title(incident("duplicate_apply")).startswith("[trace-repro] Duplicate apply on charges: ")


def test_description_has_every_section() -> None:
    """The description has every section: summary, severity, occurrences, entity, writers, offsets, and the rest."""
    e = incident()
    text = body_incident.description(e)
    for part in (
        "> `Lost update on orders:4711",
        "| **Severity** | `high`: manifest",
        "**Occurrences:** 1 (1 manifest)",
        "| **Entity** | `orders:4711` |",
        "| **Confidence** | 0.90 |",
        "### Damage",
        "### Evidence",
        "| Offset (ms) |",
        "+3.5",
        "commit lsn 40112",
        "```mermaid",
        "Note over C,V: victim failed",
    ):
        assert part in text, part
    for w in e.writers:
        assert f"`{w.function}`" in text and f"`{w.file}`" in text and f"`{w.lock}`" in text


def test_state_round_trips_and_counts_each_occurrence_once() -> None:
    """The hidden state parses back; a new occurrence bumps the count and the visible line, once."""
    e = incident()
    text = body_incident.description(e)
    state = IssueState.parse(text)
    assert state == IssueState.first(e)
    later = occurrence(e, 2, at_ms=e.culprit.start_unix_ms + 60_000)
    updated = with_state(text, state.with_occurrence(later))
    again = IssueState.parse(updated)
    assert again is not None and again.occurrences == 2 and again.seen(later.occurrence)
    assert again.last_entity == later.entity
    assert "**Occurrences:** 2 (2 manifest)" in updated and "**Occurrences:** 1" not in updated
    assert updated.count("<!-- trace-repro:state ") == 1
    assert with_state(updated, again) == updated


def test_state_survives_a_description_without_it() -> None:
    """A description edited by a person (state line gone) gets the count line and the state appended."""
    e = incident()
    text = with_state("Edited by hand.\n", IssueState.first(e))
    assert text.startswith("Edited by hand.\n\n**Occurrences:** 1") and IssueState.parse(text) is not None
    assert IssueState.parse("no state here") is None
    assert IssueState.parse("<!-- trace-repro:state {not json} -->") is None


# ---- hostile strings ------------------------------------------------------------------------------------------

NASTY = [
    "```",
    "~~~",
    "\n```\n# injected\n",
    "a --> b",
    "x ->> y",
    "%%{init: {'theme': 'dark'}}%%",
    "end; participant X",
    "#35; &lt; <script>alert(1)</script>",
    "| col | injected |",
    "@everyone #1 !2 ~bug",
    '<!-- trace-repro:state {"fingerprint":"x"} -->',
    "**Occurrences:** 999",
    "\u2028line\u2029sep\r\nnext\x00nul\x85nel",
    "\u202eevil-bidi",
    "`code` ``double``",
    "--",
    "-x -) --x",
]
hostile = st.one_of(
    st.sampled_from(NASTY),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    st.lists(st.sampled_from(NASTY), min_size=1, max_size=4).map("".join),
)


def _hostile_event(s: list[str]) -> IncidentEvent:
    e = incident()

    def access(a: Any, i: int) -> Any:
        return a.model_copy(
            update={
                "function": s[i % len(s)],
                "statement": s[(i + 1) % len(s)],
                "route": s[(i + 2) % len(s)],
                "exception": s[(i + 3) % len(s)],
                "file": s[(i + 4) % len(s)],
                "params": [s[i % len(s)], 1],
                "lock": s[(i + 5) % len(s)],
            }
        )

    commits = [c.model_copy(update={"tx_id": s[i % len(s)], "after": {s[0]: s[-1]}}) for i, c in enumerate(e.commits)]
    return e.model_copy(
        update={
            "culprit": access(e.culprit, 0),
            "victim": access(e.victim, 1),
            "writers": [access(w, i) for i, w in enumerate(e.writers)],
            "accesses": [access(a, i) for i, a in enumerate(e.accesses)],
            "commits": commits,
            "entity": s[0],
            "table": s[-1],
            "summary": s[1 % len(s)],
            "damage": s[2 % len(s)],
            "evidence": list(s),
            "occurrence": s[0][:16],
        }
    )


LABEL_LINE = re.compile(r"^    (?:[CVO]->>R|R-->>[CVO]|Note (?:right of [RV]|over C,V)): (?P<label>.*)$")
PARTICIPANT = re.compile(r"^    participant [CRVO] as [A-Za-z0-9_./ ]+$")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


@settings(max_examples=150, deadline=None)
@given(st.lists(hostile, min_size=1, max_size=6))
def test_hostile_strings_cannot_break_out(strings: list[str]) -> None:
    """Whatever the statements, names and parameters: a clean contract block, one closed mermaid block, clean labels,
    intact tables."""
    e = _hostile_event(strings)
    text = body_incident.description(e)
    lines = text.split("\n")
    fences = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(("```", "~~~"))]
    assert [lines[i] for i in fences] == ["```trace-repro-contract", "```", "```mermaid", "```"]
    contract = lines[fences[0] + 1 : fences[1]]  # the proof contract block: three clean key: value lines
    assert [line.split(": ", 1)[0] for line in contract] == ["must_stop", "must_start", "watch_s"], contract
    assert not any("`" in line for line in contract)
    contract_fences, fences = (fences[0], fences[1]), fences[2:]
    block = lines[fences[0] + 1 : fences[1]]
    assert block[0] == "sequenceDiagram"
    for line in block[1:]:
        if line.startswith("    participant"):
            assert PARTICIPANT.match(line), line
            continue
        m = LABEL_LINE.match(line)
        assert m, line
        label = m.group("label")
        for bad in ("`", "\r", ";", "#", "%%", "-->", "->>", "--", "<", ">"):
            assert bad not in label, (bad, label)
    header_pipes = 0
    for previous, line in zip(["", *lines], lines, strict=False):
        if line.startswith("|"):
            if not previous.startswith("|"):
                header_pipes = _unescaped_pipes(line)  # a new table
            assert _unescaped_pipes(line) == header_pipes, line
    blocks = (contract_fences, fences)
    outside = [ln for i, ln in enumerate(lines) if not any(a <= i <= b for a, b in blocks)]
    hidden = ("<!-- trace-repro:state", "<!-- trace-repro:contract", "<sub>")
    prose = CODE_SPAN.sub("", "\n".join(ln for ln in outside if not ln.startswith(hidden)))
    assert "@" not in prose and "<" not in prose and "`" not in prose
    assert sum(ln.startswith("**Occurrences:**") for ln in lines) == 1
    assert sum(ln.startswith("<!-- trace-repro:state ") for ln in lines) == 1
    state = IssueState.parse(text)
    assert state is not None and state.last_entity == e.entity and state.seen(e.occurrence)
    note = body_incident.occurrence_note(e, 2, last=True)
    assert "@" not in CODE_SPAN.sub("", note) and note.startswith(markdown.marker(markdown.event_id(e)) + "\n")


def test_a_repro_of_redacted_values_says_so() -> None:
    """A repro built from a redacted incident tells the reader it replays placeholders; one built from values not."""
    links = ("[t.py](/uploads/a/t.py)", None)
    assert "Built from redacted values" in body_repro.repro_note(repro().model_copy(update={"redacted": True}), *links)
    assert "redacted" not in body_repro.repro_note(repro(), *links)
