"""Regressions reach GitLab: filed once per fingerprint, deduplicated across instances, closed by FIXED, reopened."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest

from bench.gitlab_server import FakeGitLab
from processors.model.outputs import RegressionEvent, VerdictEvent
from sinks.gitlab import body_regression, markdown
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import (
    RecordingSleep,
    deliver,
    incident,
    recurrence,
    regression,
    state_of,
    user_notes,
    verdict,
)

FP_LABEL = markdown.fingerprint_label(regression().fingerprint)
LIVE_REF = re.compile(r"[@#!~%$&^][\w\"']")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def one_issue(server: FakeGitLab, label: str = FP_LABEL) -> dict[str, Any]:
    issues = server.issues(tag=label)
    assert len(issues) == 1, [i["iid"] for i in issues]
    return issues[0]


def fixed(e: RegressionEvent, *, after_ms: float) -> VerdictEvent:
    """A FIXED verdict on ``e``'s fingerprint whose window starts at ``after_ms``."""
    v = verdict(fingerprint=e.fingerprint, contract=e.signature, version="1.5.1")
    return v.model_copy(update={"receipt": v.receipt.model_copy(update={"window_start_unix_ms": after_ms})})


async def test_a_regression_files_one_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The first occurrence files an issue titled from the summary, tagged with its fingerprint, with the rendered
    body."""
    sink = make_sink(labels=("trace-repro", "performance"))
    e = regression("latency")
    await deliver(sink, e, e)
    issue = one_issue(server, markdown.fingerprint_label(e.fingerprint))
    assert issue["title"] == body_regression.title(e) and issue["title"].startswith("[trace-repro] Regression: GET ")
    assert issue["labels"] == ["trace-repro", "performance", "anomaly::regression"]
    assert issue["description"] == body_regression.description(e)
    assert "```mermaid\nxychart-beta\n" in issue["description"]
    assert issue["state"] == "opened" and user_notes(server, issue["iid"]) == []
    assert sink.issue_iid(e.fingerprint) == issue["iid"] and sink.telemetry.events["issues_created"] == 1
    assert state_of(issue).occurrences == 1  # the same event twice (a replay) was counted once
    await deliver(sink, incident())  # an incident is another fingerprint: another issue
    assert len(server.issues()) == 2 and len(server.issues(tag=FP_LABEL)) == 0


async def test_later_occurrences_count_up_with_bounded_notes(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Five windows: the count says 5, and only the first two repeats got a note (the second says so)."""
    sink = make_sink(occurrence_notes=2)
    e = regression()
    await deliver(sink, e, *(recurrence(e, n) for n in range(2, 6)))
    issue = one_issue(server)
    state = state_of(issue)
    assert state.occurrences == 5 and state.last_seen_ms == recurrence(e, 5).window_start_unix_ms
    assert "**Occurrences:** 5 · first seen 2027-01-15T08:50:00.000Z" in issue["description"]
    notes = user_notes(server, issue["iid"])
    assert [n.split("\n")[0] for n in notes] == [markdown.marker(markdown.event_id(recurrence(e, n))) for n in (2, 3)]
    assert sum("Further occurrences only update the count" in n for n in notes) == 1
    assert sink.telemetry.events["occurrences"] == 4 and sink.telemetry.events["notes"] == 2


async def test_racing_instances_end_with_one_open_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Two instances, each in its own thread and event loop, file the same regression at once: one stays open."""
    e = regression()
    server.inject(r"/issues$", "barrier", method="POST", parties=2)
    a, b = make_sink(), make_sink()

    def race() -> None:
        threads = [threading.Thread(target=asyncio.run, args=(deliver(sink, event),))
                   for sink, event in ((a, e), (b, recurrence(e, 2)))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)

    await asyncio.to_thread(race)
    issues = server.issues(tag=FP_LABEL)
    assert len(issues) == 2  # both created: the barrier made sure both looked up before either created
    winner, loser = sorted(issues, key=lambda i: i["iid"])
    assert winner["state"] == "opened" and loser["state"] == "closed"
    assert len([n for n in user_notes(server, loser["iid"]) if f"duplicate of #{winner['iid']}" in n]) == 1
    assert a.issue_iid(e.fingerprint) == b.issue_iid(e.fingerprint) == winner["iid"]
    assert state_of(winner).occurrences == 2  # the loser's occurrence was counted on the winner
    await deliver(make_sink(), recurrence(e, 3))  # later lookups keep choosing the winner
    assert state_of(server.issues(tag=FP_LABEL)[0]).occurrences == 3


async def test_fixed_verdict_closes_and_a_recurrence_reopens(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """FIXED closes the regression's issue; a window after the fix reopens it with a note; a late one does not."""
    sink = make_sink()
    e = regression()
    v = fixed(e, after_ms=recurrence(e, 2).window_end_unix_ms)
    await deliver(sink, e, v)
    issue = one_issue(server)
    assert issue["state"] == "closed" and sink.telemetry.events["closed"] == 1
    assert any(n.startswith(markdown.marker(markdown.event_id(v))) for n in user_notes(server, issue["iid"]))
    assert state_of(issue).fixed_after_ms == v.receipt.window_start_unix_ms
    late, after = recurrence(e, 2), recurrence(e, 3)
    await deliver(sink, late)
    issue = one_issue(server)
    assert issue["state"] == "closed" and state_of(issue).occurrences == 2 and "reopened" not in sink.telemetry.events
    await deliver(sink, after)
    issue = one_issue(server)
    assert issue["state"] == "opened" and state_of(issue).occurrences == 3 and sink.telemetry.events["reopened"] == 1
    [reopening] = [n for n in user_notes(server, issue["iid"]) if "### Recurrence" in n]
    assert reopening.startswith(markdown.marker(markdown.reopen_id(after))) and "verified fixed" in reopening
    await deliver(make_sink(), v, after)  # a replayed verdict does not close the recurrence again
    assert one_issue(server)["state"] == "opened"


async def test_manually_closed_issue_reopens_on_a_new_window(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Closed by a person (no FIXED verdict recorded): the next new occurrence is a recurrence."""
    sink = make_sink()
    e = regression()
    await deliver(sink, e)
    server.store.data["issues"][0]["state"] = "closed"
    await deliver(sink, recurrence(e, 2))
    issue = one_issue(server)
    assert issue["state"] == "opened"
    assert any("after the issue was closed" in n for n in user_notes(server, issue["iid"]))


async def test_replay_posts_nothing_twice(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Replaying every event, in the same sink and in fresh ones, adds no note and counts no occurrence twice."""
    e = regression()
    events = [e, recurrence(e, 2), fixed(e, after_ms=recurrence(e, 3).window_start_unix_ms), recurrence(e, 3)]
    await deliver(make_sink(), *events)
    before = one_issue(server)
    notes = user_notes(server, before["iid"])
    assert len(notes) == 3 and len({n.split("\n")[0] for n in notes}) == 3  # occurrence, verdict, recurrence
    await deliver(make_sink(), *events)
    sink = make_sink()
    await deliver(sink, *events, *events)
    after = one_issue(server)
    assert after["description"] == before["description"] and state_of(after).occurrences == 3
    assert after["state"] == before["state"] == "opened" and user_notes(server, after["iid"]) == notes
    assert "notes" not in sink.telemetry.events and "issues_created" not in sink.telemetry.events


@pytest.mark.parametrize(
    ("method", "path"),
    [pytest.param("POST", r"/issues$", id="create-issue"), pytest.param("POST", r"/notes$", id="create-note"),
     pytest.param("PUT", r"/issues/\d+$", id="update-issue")],
)  # fmt: skip
async def test_lost_answers_duplicate_nothing(
    server: FakeGitLab, make_sink: SinkFactory, sleeps: RecordingSleep, method: str, path: str
) -> None:
    """A write that reached GitLab but whose answer was lost (twice) is retried without a second issue or note."""
    sink = make_sink()
    e = regression()
    armed = server.inject(path, "error", method=method, count=2, status=502, apply=True)
    await deliver(sink, e, recurrence(e, 2))
    issue = one_issue(server)
    assert state_of(issue).occurrences == 2 and len(user_notes(server, issue["iid"])) == 1
    assert armed.hits >= 1 and len(sleeps.waits) == armed.hits and sink.pending == 0


async def test_production_text_is_escaped(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Mentions, references, quick actions, HTML and fences in production text stay inert in the filed issue."""
    nasty = "@everyone #1 !2 ~bug\n/close\n/assign @me <img src=x> ``` %%{init}%%"
    e = regression(summary=nasty, operation=nasty, service=nasty, signature=nasty, version=nasty, commit=nasty)
    await deliver(make_sink(occurrence_notes=1), e, recurrence(e, 2))
    issue = one_issue(server)
    assert not LIVE_REF.search(issue["title"]) and "\n" not in issue["title"]
    for text in (issue["description"], *user_notes(server, issue["iid"])):
        lines = text.split("\n")
        assert not any(ln.startswith("/") for ln in lines)  # no quick action
        assert sum(ln.startswith("```") for ln in lines) in (0, 2)
        prose = CODE_SPAN.sub("", "\n".join(ln for ln in lines if not ln.startswith(("<!--", "<sub>", "    "))))
        assert "@" not in prose and "<" not in prose and not LIVE_REF.search(prose)
    chart = issue["description"].split("```mermaid\n", 1)[1].split("```", 1)[0].splitlines()
    assert len(chart) == 5 and re.fullmatch(r'    title "[^"`;#%<>]*"', chart[1]), chart  # a fenced chart: inert
