"""Shared helpers of the GitLab sink tests: realistic events from the fixtures, a recording sleep, the token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bench.gitlab_server import FakeGitLab
from processors.model.outputs import AccessInfo, IncidentEvent, Published, RegressionEvent, ReproEvent, VerdictEvent
from sinks.gitlab import GitLabSink
from sinks.gitlab.links import Links
from sinks.gitlab.state import IssueState

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = Path(__file__).parent / "golden"
TOKEN = "glpat-TEST-s3cr3t-9f8e7d6c5b4a"
PROJECT = "trace-repro/shop"
LINKS = Links(
    trace_url="https://tempo.example.com/trace/{trace_id}",
    source_url="https://gitlab.example.com/trace-repro/shop/-/blob/{ref}/{path}#L{line}",
    source_roots=("/srv/other", "/builds/shop"),
)


def incident(name: str = "lost_update", **changes: Any) -> IncidentEvent:
    """A realistic incident from ``fixtures/incident_<name>.json``, with top-level fields replaced."""
    event = IncidentEvent.model_validate_json((FIXTURES / f"incident_{name}.json").read_text())
    return event.model_copy(update=changes)


def built_at(e: IncidentEvent, root: str) -> IncidentEvent:
    """``e`` as a build machine reports it: every access's ``code.file.path`` absolute under ``root`` (the culprit's
    with a line number, the victim's without)."""

    def moved(a: AccessInfo) -> AccessInfo:
        line = 57 if a.trace_id == e.culprit.trace_id else 0
        return a.model_copy(update={"file": f"{root}/{a.file}", "line": line}) if a.file else a

    update = {"culprit": moved(e.culprit), "victim": moved(e.victim), "writers": [moved(w) for w in e.writers],
              "accesses": [moved(a) for a in e.accesses]}  # fmt: skip
    return e.model_copy(update=update)


def occurrence(base: IncidentEvent, n: int, *, at_ms: float | None = None) -> IncidentEvent:
    """Occurrence number ``n`` of ``base``'s defect: another occurrence id, entity and (optionally) time."""
    culprit = base.culprit.model_copy(update={"start_unix_ms": at_ms}) if at_ms is not None else base.culprit
    return base.model_copy(
        update={"occurrence": f"{base.occurrence[:8]}{n:08x}", "entity": f"orders:{4711 + n}", "culprit": culprit}
    )


def regression(metric: str = "errors", **changes: Any) -> RegressionEvent:
    """A realistic regression from ``fixtures/regression_<metric>.json``, with top-level fields replaced."""
    event = RegressionEvent.model_validate_json((FIXTURES / f"regression_{metric}.json").read_text())
    return event.model_copy(update=changes)


def recurrence(base: RegressionEvent, n: int, *, at_ms: float | None = None) -> RegressionEvent:
    """Occurrence ``n`` of ``base``'s regression: the window ``n - 1`` windows later (or the one from ``at_ms``)."""
    size = base.window_end_unix_ms - base.window_start_unix_ms
    start = base.window_start_unix_ms + (n - 1) * size if at_ms is None else at_ms
    window = f"{start:.0f}-{start + size:.0f}"
    return base.model_copy(
        update={"occurrence": f"{base.occurrence[:8]}{n:08x}", "window": window, "window_start_unix_ms": start,
                "window_end_unix_ms": start + size, "detected_at_unix_ms": start + size}
    )  # fmt: skip


def repro() -> ReproEvent:
    return ReproEvent.model_validate_json((FIXTURES / "repro_lost_update.json").read_text())


def verdict(**changes: Any) -> VerdictEvent:
    event = VerdictEvent.model_validate_json((FIXTURES / "verdict_lost_update_fixed.json").read_text())
    return event.model_copy(update=changes)


async def deliver(sink: GitLabSink, *events: Published) -> None:
    """Write ``events`` to ``sink`` in order, then flush."""
    for e in events:
        await sink.write(e)
    await sink.flush()


def user_notes(server: FakeGitLab, iid: int) -> list[str]:
    """The bodies of the notes people (and the sink) wrote on issue ``iid``, without GitLab's system notes."""
    return [n["body"] for n in server.notes(iid)]


def state_of(issue: dict[str, Any]) -> IssueState:
    """The hidden state in an issue's description (which must have one)."""
    state = IssueState.parse(issue["description"])
    assert state is not None
    return state


def check_golden(name: str, text: str) -> None:
    """``text`` is byte for byte ``golden/<name>`` (``UPDATE_GOLDEN=1`` rewrites the file instead)."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file; UPDATE_GOLDEN=1 rewrites it"


class RecordingSleep:
    """An async sleep that returns at once and remembers how long it was asked to wait."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
