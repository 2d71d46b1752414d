"""The evidence packet in the issue: the repro note summarises it (the reduction, what the repro was made and run
with, production's services) and lists what the reduction removed, every recorded value a code span that hostile
text cannot leave; a repro without a packet shows none of it."""

from __future__ import annotations

import re
from typing import Any

from processors.model.outputs import ReproEvent
from sinks.gitlab.body_repro import repro_note
from tests.gitlab.helpers import repro

HOSTILE = "svc` | **bold** [link](http://x) <img src=x>\n# heading"


def _evidence(**reduction: Any) -> dict[str, Any]:
    return {
        "format": 1,
        "level": "sql",
        "python": {"version": "3.11.7", "implementation": "CPython"},
        "packages": {"psycopg": "3.2.9", "libcst": "1.5.0", "SQLAlchemy": "2.0.40"},
        "trace_repro": "0.9.0",
        "postgresql": {"repro_server": "18.1", "production": None},
        "production": {
            "traces": [
                {"trace_id": "a" * 32, "service": HOSTILE, "version": "1.2.3"},
                {"trace_id": "b" * 32, "service": "jobs", "version": ""},
            ],
            "not_on_incidents": ["db.system"],
        },
        "settings": {"collisions": {"window_s": 2.0}},
        "reduction": {
            "enabled": True,
            "shipped": "reduced",
            "why": "",
            "steps": {"full": 8, "kept": 6},
            "rows": {"full": 4, "kept": 2},
            "removed_rows": [{"acct": "pad-1", "balance": 7}],
            "runs": 7,
            "removed_steps": [{"session": 2, "kind": "read", "statement": "SELECT `x` | y", "params": [HOSTILE]}],
            "stopped_by": "",
            "full_test": "full_test_repro_x_sql.py",
            **reduction,
        },
    }


def _note(event: ReproEvent) -> str:
    return repro_note(event, "[t.py](/uploads/a/t.py)", None)


def test_the_note_summarises_the_packet_and_lists_what_the_reduction_removed() -> None:
    note = _note(repro().model_copy(update={"evidence": _evidence()}))
    assert "| **Reduced** | 6 of 8 steps, 2 of 4 seed rows, each candidate run on the scratch database (7 runs); " \
           "the full repro is `full_test_repro_x_sql.py` |" in note  # fmt: skip
    assert "Python `3.11.7`, `SQLAlchemy` `2.0.40`, `psycopg` `3.2.9`, PostgreSQL `18.1`, trace-repro `0.9.0`" in note
    assert "`jobs (no service.version)`" in note
    assert "**Removed by the reduction** (1 statements, 1 seed rows)" in note
    assert "- seed row `{'acct': 'pad-1', 'balance': 7}`" in note
    assert "`evidence.json` beside the test" in note


def test_hostile_recorded_text_stays_inside_its_code_span() -> None:
    """Outside the code spans of the note no piece of the hostile service name or parameter is left, and it adds no
    line of its own (no heading)."""
    note = _note(repro().model_copy(update={"evidence": _evidence()}))
    shown = [line for line in note.splitlines() if "svc" in line]
    assert len(shown) == 2  # the production row and the removed statement
    for line in shown:
        outside = re.sub(r"`[^`]*`", "", line)
        assert not any(piece in outside for piece in ("svc", "**bold**", "[link]", "<img", "heading")), line
    assert not any(line.startswith("# heading") for line in note.splitlines())


def test_a_repro_not_reduced_says_why_and_the_bound_that_stopped_one_is_named() -> None:
    off = _evidence(shipped="full", why="reduction is off ([repro] reduce)")
    note = _note(repro().model_copy(update={"evidence": off}))
    assert "| **Reduced** | not reduced: `reduction is off ([repro] reduce)` |" in note
    assert "Removed by the reduction" not in note
    stopped = _note(repro().model_copy(update={"evidence": _evidence(stopped_by="max_runs")}))
    assert "; stopped by `max_runs` |" in stopped


def test_a_repro_without_a_packet_shows_none() -> None:
    note = _note(repro())
    assert "Reduced" not in note and "Made and run with" not in note and "evidence.json" not in note
