"""The GitLab sink against the fake GitLab server: issues, notes, faults, restarts, races, closing and reopening."""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any

import pytest

from bench.gitlab_server import FakeGitLab
from processors.api.telemetry import Telemetry
from processors.model.outputs import ProofContract
from sinks.base import PermanentSinkError, RetryableSinkError, Sink
from sinks.gitlab import GitLabPermanentError, GitLabRetryableError, body_incident, markdown
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import (
    FIXTURES,
    RecordingSleep,
    deliver,
    incident,
    occurrence,
    regression,
    repro,
    state_of,
    user_notes,
    verdict,
)

FP_LABEL = markdown.fingerprint_label(incident().fingerprint)
CLOSING = re.compile(r"(?i)\b(clos(e|es|ed|ing)|fix(es|ed|ing)?|resolv(e|es|ed|ing)|implement(s|ed|ing)?)\b:?\s+#\d+")


def one_issue(server: FakeGitLab) -> dict[str, Any]:
    issues = server.issues(tag=FP_LABEL)
    assert len(issues) == 1, [i["iid"] for i in issues]
    return issues[0]


async def test_first_incident_files_one_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The first occurrence files an issue with the stable title, the labels and the rendered description."""
    sink = make_sink(labels=("trace-repro", "bug"))
    e = incident()
    await deliver(sink, e)
    issue = one_issue(server)
    assert issue["title"] == body_incident.title(e)
    assert issue["labels"] == ["trace-repro", "bug", "anomaly::lost_update", "severity::high"]
    assert issue["description"] == body_incident.description(e)
    assert issue["state"] == "opened" and user_notes(server, issue["iid"]) == []
    assert sink.issue_url(e.fingerprint) == issue["web_url"] and sink.issue_iid(e.fingerprint) == 1
    assert sink.issue_url("unknown") is None
    labels = {lb["name"] for lb in server.store.data["labels"]}
    assert {"trace-repro", "bug", "anomaly::lost_update", "severity::high"} <= labels and FP_LABEL not in labels


async def test_repeated_occurrences_count_up_with_bounded_notes(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Eight occurrences: the count says 8, and only the first five repeats got a note (the fifth says so)."""
    sink = make_sink(occurrence_notes=5)
    e = incident()
    await deliver(sink, e, *(occurrence(e, n) for n in range(2, 9)))
    issue = one_issue(server)
    assert state_of(issue).occurrences == 8
    assert "**Occurrences:** 8 (8 manifest)" in issue["description"]
    notes = user_notes(server, issue["iid"])
    assert len(notes) == 5
    assert sorted(int(re.search(r"\*\*Occurrence (\d+)\*\*", n).group(1)) for n in notes) == [2, 3, 4, 5, 6]  # type: ignore[union-attr]
    assert sum("Further occurrences only update the count" in n for n in notes) == 1


async def test_a_better_evidenced_occurrence_upgrades_the_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A latent, uncorrelated first occurrence, then a manifest correlated one of the same defect: one issue, whose
    description now shows the better one (with a note saying so) and its label severity::high instead of
    severity::low; a weaker later one changes nothing shown."""
    sink = make_sink()
    strong = incident()
    weak = strong.model_copy(
        update={"manifest": False, "correlated": False, "damage": "", "confidence": 0.6, "severity": "low"}
    )
    await deliver(sink, weak)
    assert "_None observed: the collision is latent._" in one_issue(server)["description"]
    assert "severity::low" in one_issue(server)["labels"]
    better = occurrence(strong, 2)
    await deliver(sink, better, occurrence(weak, 3))
    issue = one_issue(server)
    assert (
        issue["description"].split("**Occurrences:**")[0]
        == body_incident.description(better).split("**Occurrences:**")[0]
    )
    state = state_of(issue)
    assert (state.occurrences, state.manifest, state.evidence) == (3, 1, (1.0, 1.0, better.confidence))
    notes = user_notes(server, issue["iid"])
    assert sum(n.startswith(markdown.marker(f"upgrade-{better.occurrence}")) for n in notes) == 1
    assert len(server.issues(tag=FP_LABEL)) == 1
    assert [lb for lb in issue["labels"] if lb.startswith("severity::")] == ["severity::high"]


async def test_replayed_events_change_nothing(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Replaying every event, in the same sink and in a fresh one, posts no note twice and counts nothing twice."""
    e = incident()
    events = [e, occurrence(e, 2), repro(), verdict(outcome="NOT_FIXED")]
    await deliver(make_sink(), *events)
    before = one_issue(server)
    notes = user_notes(server, before["iid"])
    await deliver(make_sink(), *events)
    sink = make_sink()
    await deliver(sink, *events, *events)
    after = one_issue(server)
    assert after["description"] == before["description"] and state_of(after).occurrences == 2
    assert user_notes(server, after["iid"]) == notes and len(notes) == 3
    assert len(server.store.data["uploads"]) == 2  # the repro's attachments were uploaded once


async def test_restart_finds_the_issue_by_its_label(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A new sink instance (crash and restart: empty cache, same server) adds to the same issue."""
    e = incident()
    await deliver(make_sink(), e)
    restarted = make_sink()
    await deliver(restarted, occurrence(e, 2))
    issue = one_issue(server)
    assert state_of(issue).occurrences == 2 and restarted.issue_iid(e.fingerprint) == issue["iid"]
    assert [m for m, p in server.requests if m == "POST" and p.endswith("/issues")] == ["POST"]


async def test_racing_instances_end_with_one_open_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Two instances, each in its own thread and event loop, create the same fingerprint at once: one stays open."""
    e = incident()
    server.inject(r"/issues$", "barrier", method="POST", parties=2)
    a, b = make_sink(), make_sink()

    def race() -> None:
        threads = [threading.Thread(target=asyncio.run, args=(deliver(sink, event),))
                   for sink, event in ((a, e), (b, occurrence(e, 2)))]  # fmt: skip
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
    await deliver(make_sink(), occurrence(e, 3))  # later lookups keep choosing the winner
    assert len(server.issues(tag=FP_LABEL)) == 2 and state_of(server.issues(tag=FP_LABEL)[0]).occurrences == 3


async def test_deleted_issue_is_filed_again(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A deleted issue the sink still remembers: an occurrence files a new one, a later verdict is an orphan."""
    sink = make_sink()
    e = incident()
    await deliver(sink, e)
    server.store.data["issues"].clear()
    await deliver(sink, occurrence(e, 2))
    issue = one_issue(server)
    assert issue["iid"] == 1 and sink.issue_iid(e.fingerprint) == 1 and state_of(issue).occurrences == 1
    server.store.data["issues"].clear()
    await deliver(sink, verdict())  # the remembered issue is gone and none is left: an orphan, not a failure
    assert sink.telemetry.dropped["orphan"] == 1 and sink.pending == 0 and sink.issue_iid(e.fingerprint) is None


async def test_open_duplicate_left_by_a_crash_is_closed(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """An open duplicate (its instance died before closing it) is closed by the next lookup, with a note."""
    e = incident()
    await deliver(make_sink(), e)
    server.store.data["issues"].append({**server.store.data["issues"][0], "id": 999, "iid": 2})
    sink = make_sink()
    await deliver(sink, occurrence(e, 2))
    states = {i["iid"]: i["state"] for i in server.issues(tag=FP_LABEL)}
    assert states == {1: "opened", 2: "closed"} and sink.telemetry.events["duplicates_closed"] == 1
    assert any("duplicate of #1" in n for n in user_notes(server, 2))


FAULTS = [
    pytest.param({"kind": "error", "status": 500}, id="500"),
    pytest.param({"kind": "error", "status": 503}, id="503"),
    pytest.param({"kind": "rate_limit", "retry_after": 3}, id="429"),
    pytest.param({"kind": "hang"}, id="timeout"),
    pytest.param({"kind": "drop"}, id="drop"),
    pytest.param({"kind": "error", "status": 502, "apply": True}, id="apply-then-500"),
    pytest.param({"kind": "hang", "apply": True}, id="apply-then-timeout"),
    pytest.param({"kind": "drop", "apply": True}, id="apply-then-drop"),
]
STEPS = [
    pytest.param("POST", r"/issues$", id="create-issue"),
    pytest.param("GET", r"/issues$", id="list-issues"),
    pytest.param("GET", r"/issues/\d+$", id="get-issue"),
    pytest.param("PUT", r"/issues/\d+$", id="update-issue"),
    pytest.param("GET", r"/notes$", id="list-notes"),
    pytest.param("POST", r"/notes$", id="create-note"),
]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize(("method", "path"), STEPS)
async def test_faults_lose_nothing_and_duplicate_nothing(
    server: FakeGitLab, make_sink: SinkFactory, sleeps: RecordingSleep, method: str, path: str, fault: dict[str, Any]
) -> None:
    """Each fault on each kind of call, twice in a row: one issue, one note per event, every occurrence counted."""
    sink = make_sink(timeout_s=0.2 if fault["kind"] == "hang" else 5.0)
    e = incident()
    armed = server.inject(path, method=method, count=2, **{**fault, "hang_s": 0.6})
    await deliver(sink, e, occurrence(e, 2), verdict(outcome="NOT_FIXED"))
    issue = one_issue(server)
    assert state_of(issue).occurrences == 2
    notes = user_notes(server, issue["iid"])
    assert len(notes) == 2 and len(set(notes)) == 2
    assert sum(n.startswith(markdown.marker(markdown.event_id(occurrence(e, 2)))) for n in notes) == 1
    assert armed.hits >= 1 and len(sleeps.waits) == armed.hits and sink.pending == 0
    if fault["kind"] == "rate_limit":
        assert all(w >= fault["retry_after"] for w in sleeps.waits)  # the header was honoured


async def test_exhausted_retries_raise_retryable_and_keep_the_event(
    server: FakeGitLab, make_sink: SinkFactory, sleeps: RecordingSleep
) -> None:
    """Past max_attempts the flush raises a retryable error and keeps the event queued; the next flush delivers."""
    sink = make_sink(max_attempts=3, backoff_s=0.5, max_backoff_s=1.5)
    server.inject(r"/issues$", "error", method="POST", count=100, status=500)
    await sink.write(incident())
    with pytest.raises(RetryableSinkError) as info:
        await sink.flush()
    assert isinstance(info.value, GitLabRetryableError) and info.value.retry_after_s is None  # 500s send none
    assert sink.pending == 1 and server.issues() == [] and sink.telemetry.events["retries"] == 2
    assert len(sleeps.waits) == 2 and 0.25 <= sleeps.waits[0] <= 0.5 and 0.5 <= sleeps.waits[1] <= 1.0
    server.clear_faults()
    await sink.flush()
    assert sink.pending == 0 and len(server.issues(tag=FP_LABEL)) == 1


async def test_long_retry_after_gives_up_at_once(
    server: FakeGitLab, make_sink: SinkFactory, sleeps: RecordingSleep
) -> None:
    """A Retry-After beyond max_retry_after_s is not slept through: the flush fails retryably, asking the runner to
    wait max_retry_after_s (not the server's ten minutes)."""
    sink = make_sink(max_retry_after_s=60)
    server.inject(r"/issues$", "rate_limit", method="GET", retry_after=600)
    await sink.write(incident())
    with pytest.raises(RetryableSinkError) as info:
        await sink.flush()
    assert isinstance(info.value, GitLabRetryableError) and info.value.retry_after_s == 60
    assert sleeps.waits == [] and sink.pending == 1


async def test_permanent_error_drops_the_event_with_it(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A 422 (GitLab refuses this event's content) is not retried; the event leaves the queue attached to the
    error, and the next event is delivered."""
    sink = make_sink()
    e = incident()
    server.inject(r"/issues$", "error", method="POST", status=422)
    await sink.write(e)
    await sink.write(incident(fingerprint="f" * 16, occurrence="f" * 16))
    with pytest.raises(PermanentSinkError) as info:
        await sink.flush()
    assert isinstance(info.value, GitLabPermanentError) and not isinstance(info.value, RetryableSinkError)
    assert info.value.status == 422 and info.value.event == e and sink.pending == 1 and sink.parked is None
    await sink.flush()
    assert sink.pending == 0 and len(server.issues()) == 1


async def test_permanent_refusals_are_counted_in_the_given_telemetry(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """Each event GitLab refuses for good is one ``rejected`` drop in the telemetry the sink was built with."""
    telemetry = Telemetry("gitlab")
    sink = make_sink(telemetry=telemetry)
    await deliver(sink, incident())
    assert telemetry.dropped == {"rejected": 0, "orphan": 0, "max_queued": 0, "rollback_refused": 0}
    assert telemetry.events["issues_created"] == 1
    server.inject(r"/notes$", "error", method="POST", status=400, count=2)
    e = incident()
    for event in (occurrence(e, 2), occurrence(e, 3)):
        await sink.write(event)
    for _ in range(2):  # the runtime flushes again after each permanent error: the next event is tried
        with pytest.raises(GitLabPermanentError) as info:
            await sink.flush()
        assert info.value.status == 400
    assert telemetry.dropped["rejected"] == 2 and sink.pending == 0 and "notes" not in telemetry.events
    await deliver(sink, occurrence(e, 4))
    assert telemetry.dropped["rejected"] == 2 and telemetry.events["notes"] == 1


async def test_is_a_sink_that_ignores_other_kinds(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The sink implements ``sinks.base.Sink`` as ``gitlab``; kinds it does not file are not even queued."""
    sink = make_sink()
    assert isinstance(sink, Sink) and sink.name == "gitlab"
    await sink.write(ProofContract(signature="error:*:RoundingError", fingerprint=incident().fingerprint))
    assert sink.pending == 0
    await sink.write(regression())
    assert sink.pending == 1


async def test_fixed_verdict_closes_and_a_regression_reopens(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """FIXED closes with the receipt; a later occurrence reopens with a note; replaying the verdict keeps it open."""
    sink = make_sink()
    e, v = incident(), verdict()
    await deliver(sink, e, v)
    issue = one_issue(server)
    assert issue["state"] == "closed"
    assert any("Verdict: **`FIXED`**" in n and "23 errors / 1902 requests" in n for n in user_notes(server, 1))
    after_fix = occurrence(e, 2, at_ms=v.receipt.window_start_unix_ms + 5_000)
    await deliver(sink, after_fix)
    issue = one_issue(server)
    assert issue["state"] == "opened" and sink.telemetry.events["reopened"] == 1
    assert any(n.startswith(markdown.marker("regression-" + after_fix.occurrence)) for n in user_notes(server, 1))
    await deliver(make_sink(), v, after_fix)
    assert one_issue(server)["state"] == "opened" and state_of(one_issue(server)).occurrences == 2


async def test_late_occurrence_from_before_the_fix_does_not_reopen(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """An occurrence whose event time precedes the verdict's window is counted but does not reopen."""
    sink = make_sink()
    e, v = incident(), verdict()
    await deliver(sink, e, v, occurrence(e, 2, at_ms=v.receipt.window_start_unix_ms - 60_000))
    issue = one_issue(server)
    assert issue["state"] == "closed" and state_of(issue).occurrences == 2 and "reopened" not in sink.telemetry.events


async def test_manually_closed_issue_reopens_on_a_new_occurrence(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Closed by a person (no FIXED verdict recorded): the next new occurrence is a regression."""
    sink = make_sink()
    e = incident()
    await deliver(sink, e)
    server.store.data["issues"][0]["state"] = "closed"
    await deliver(sink, occurrence(e, 2))
    assert one_issue(server)["state"] == "opened"


async def test_repro_note_attaches_the_test_and_the_patch(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A repro note shows RED then GREEN and links the uploaded test file and patch, whose contents match."""
    await deliver(make_sink(), incident(), repro())
    [note] = user_notes(server, 1)
    assert "**RED** (`failed`" in note and "**GREEN** (`passed`" in note and "faithful" in note
    links = re.findall(r"\]\((/uploads/[^)]+)\)", note)
    assert len(links) == 2 and links[0].endswith("/test_lost_update_b98839ad1b70ae75.py")
    assert server.upload_content(links[0]) == repro().test_source.encode()
    assert server.upload_content(links[1]) == repro().patch.encode()


async def test_repro_for_an_unknown_fingerprint_is_skipped(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A repro or verdict whose incident was never filed posts nothing and is counted as an orphan."""
    sink = make_sink()
    await deliver(sink, repro(), verdict())
    assert server.issues() == [] and sink.telemetry.dropped["orphan"] == 2 and sink.pending == 0


async def test_merge_request_proves_the_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A proven repro opens one MR from trace-repro/<fp> with the test and the repaired file: "Proves #N"."""
    server.seed_file("bench/shop/jobs.py", (FIXTURES / "jobs_before.py.txt").read_text())
    sink = make_sink(merge_requests=True)
    e, r = incident(), repro()
    await deliver(sink, e, r)
    [mr] = server.merge_requests()
    branch = f"trace-repro/{e.fingerprint}"
    assert mr["source_branch"] == branch and mr["target_branch"] == "main"
    assert mr["description"].startswith("Proves #1\n") and not CLOSING.search(mr["description"])
    committed = server.file(r.test_path, branch)  # the generated test, and the one asserting the promised event
    assert committed is not None and committed.startswith(r.test_source) and "PROMISED_EVENT" in committed
    repaired = server.file("bench/shop/jobs.py", branch)
    assert repaired is not None and "row = cur.execute(READ_ORDER, (order_id,))" not in repaired
    assert server.file("bench/shop/jobs.py", "main") == (FIXTURES / "jobs_before.py.txt").read_text()
    assert any(f"Merge request !{mr['iid']}" in n for n in user_notes(server, 1))
    commits = len(server.store.data["commits"])
    await deliver(make_sink(merge_requests=True), r)  # replay: no second MR, commit or note
    assert len(server.merge_requests()) == 1 and len(server.store.data["commits"]) == commits
    assert len(user_notes(server, 1)) == 2


async def test_merge_request_attaches_a_patch_that_does_not_apply(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """When the repaired file is not in the repository the patch is committed as a file and the MR says so."""
    await deliver(make_sink(merge_requests=True), incident(), repro())
    [mr] = server.merge_requests()
    path = f".trace-repro/{incident().fingerprint}.patch"
    assert server.file(path, mr["source_branch"]) == repro().patch
    assert "did not apply cleanly" in mr["description"] and mr["description"].startswith("Proves #1")


async def test_no_merge_request_unless_enabled(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The merge-request path is off by default."""
    await deliver(make_sink(), incident(), repro())
    assert server.merge_requests() == [] and "trace-repro/" not in str(server.store.data["branches"])


async def test_healthcheck(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Healthy with the right token; unhealthy with a wrong one or when GitLab is gone."""
    assert await make_sink().healthcheck()
    assert not await make_sink(token="wrong").healthcheck()
    gone = make_sink(url="http://127.0.0.1:9")  # discard port: nothing listens
    assert not await gone.healthcheck()
