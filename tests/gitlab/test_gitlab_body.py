"""Issue bodies and notes: golden files, the hidden state, and escaping of hostile strings (hypothesis)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sinks.gitlab import body
from streamer.schemas import IncidentEvent
from tests.gitlab.helpers import incident, occurrence, repro, verdict

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file; UPDATE_GOLDEN=1 rewrites it"


@pytest.mark.parametrize("name", ["lost_update", "invariant_violation", "duplicate_apply"])
def test_issue_description_matches_golden_file(name: str) -> None:
    """The description of each anomaly class, rendered from a realistic event, is byte-for-byte the golden file."""
    check_golden(f"issue_{name}.md", body.description(incident(name)))


def test_notes_match_golden_files() -> None:
    """Occurrence, regression, reproduction, verdict and duplicate notes are byte-for-byte their golden files."""
    e = incident()
    check_golden("note_occurrence.md", body.occurrence_note(occurrence(e, 2), 2, last=False))
    check_golden(
        "note_regression.md", body.regression_note(occurrence(e, 9, at_ms=1_800_000_700_000.0), 1_800_000_600_000.0)
    )
    check_golden("note_repro.md", body.repro_note(repro(), "[t.py](/uploads/a/t.py)", "[p.patch](/uploads/b/p.patch)"))
    check_golden("note_verdict.md", body.verdict_note(verdict()))
    check_golden("note_duplicate.md", body.duplicate_note(1))


def test_title_is_stable_per_fingerprint() -> None:
    """The title names the anomaly, the table and both code paths, and does not change between occurrences."""
    e = incident()
    assert body.title(e) == (
        "[trace-repro] Lost update on orders: shop.jobs.expire_cart vs shop.handlers.capture_payment"
    )
    assert body.title(occurrence(e, 3)) == body.title(e)
    assert body.title(incident("duplicate_apply")).startswith("[trace-repro] Duplicate apply on charges: ")


def test_description_has_every_section() -> None:
    """The description has every section: summary, severity, occurrences, entity, writers, offsets, and the rest."""
    e = incident()
    text = body.description(e)
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
    text = body.description(e)
    state = body.IssueState.parse(text)
    assert state == body.IssueState.first(e)
    later = occurrence(e, 2, at_ms=e.culprit.start_unix_ms + 60_000)
    updated = body.with_state(text, state.with_occurrence(later))
    again = body.IssueState.parse(updated)
    assert again is not None and again.occurrences == 2 and again.seen(later.occurrence)
    assert again.last_entity == later.entity
    assert "**Occurrences:** 2 (2 manifest)" in updated and "**Occurrences:** 1" not in updated
    assert updated.count("<!-- trace-repro:state ") == 1
    assert body.with_state(updated, again) == updated


def test_state_survives_a_description_without_it() -> None:
    """A description edited by a person (state line gone) gets the count line and the state appended."""
    e = incident()
    text = body.with_state("Edited by hand.\n", body.IssueState.first(e))
    assert text.startswith("Edited by hand.\n\n**Occurrences:** 1") and body.IssueState.parse(text) is not None
    assert body.IssueState.parse("no state here") is None
    assert body.IssueState.parse("<!-- trace-repro:state {not json} -->") is None


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
    """Whatever the statements, names and parameters: one closed mermaid block, clean labels, intact tables."""
    e = _hostile_event(strings)
    text = body.description(e)
    lines = text.split("\n")
    fences = [i for i, ln in enumerate(lines) if ln.lstrip().startswith(("```", "~~~"))]
    assert len(fences) == 2 and lines[fences[0]] == "```mermaid" and lines[fences[1]] == "```"
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
    outside = [ln for i, ln in enumerate(lines) if not fences[0] <= i <= fences[1]]
    prose = CODE_SPAN.sub("", "\n".join(ln for ln in outside if not ln.startswith(("<!-- trace-repro:state", "<sub>"))))
    assert "@" not in prose and "<" not in prose and "`" not in prose
    assert sum(ln.startswith("**Occurrences:**") for ln in lines) == 1
    assert sum(ln.startswith("<!-- trace-repro:state ") for ln in lines) == 1
    state = body.IssueState.parse(text)
    assert state is not None and state.last_entity == e.entity and state.seen(e.occurrence)
    note = body.occurrence_note(e, 2, last=True)
    assert "@" not in CODE_SPAN.sub("", note) and note.startswith(body.marker(body.event_id(e)) + "\n")
