"""A finding of a type the GitLab sink does not know reaches GitLab as incidents do: filed once, counted, replays
ignored, closed by a FIXED verdict, reopened by a later occurrence, not by a late one; in the generic body."""

from __future__ import annotations

import re
from typing import Any

from bench.gitlab_server import FakeGitLab
from processors.model.finding import FindingEvent, Point, Series
from processors.model.outputs import VerdictEvent
from sinks.gitlab import body_finding, body_incident, body_regression, markdown
from sinks.gitlab.body import issue_body
from tests.finding_samples import SAMPLE_TYPE, T0, finding
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import LINKS, check_golden, deliver, incident, regression, state_of, user_notes, verdict

FP_LABEL = markdown.fingerprint_label(finding().fingerprint)
LIVE_REF = re.compile(r"[@#!~%$&^][\w\"']")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def one_issue(server: FakeGitLab) -> dict[str, Any]:
    issues = server.issues(tag=FP_LABEL)
    assert len(issues) == 1, [i["iid"] for i in issues]
    return issues[0]


def fixed(e: FindingEvent, *, after_ms: float) -> VerdictEvent:
    """A FIXED verdict on ``e``'s fingerprint whose window starts at ``after_ms``."""
    v = verdict(fingerprint=e.fingerprint, contract=e.contract.signature if e.contract else "", version="1.4.3")
    return v.model_copy(update={"receipt": v.receipt.model_copy(update={"window_start_unix_ms": after_ms})})


def test_the_generic_body_is_its_golden_file() -> None:
    """Title, subject, severity, remedy, contract rules, evidence, the data table, the chart and the traces."""
    e = finding()
    assert body_finding.title(e) == "[trace-repro] Hang (sample): GET /checkout hangs on payments: 20 of 320 calls"
    check_golden("finding_issue.md", body_finding.description(e, links=LINKS))
    check_golden("finding_note_occurrence.md", body_finding.occurrence_note(finding("occ-2"), 2, last=True))
    check_golden("finding_note_recurrence.md", body_finding.reopen_note(finding("occ-9"), T0 + 1000))


def test_a_type_without_a_body_of_its_own_gets_the_generic_one_and_an_incident_keeps_its_own() -> None:
    """The lookup: the type's own body, else its kind's (incident, regression), else the generic one."""
    assert issue_body(finding()).title() == body_finding.title(finding())
    assert issue_body(incident()).description() == body_incident.description(incident())
    assert issue_body(regression()).description() == body_regression.description(regression())
    assert issue_body(regression()).anomaly() == "regression" and issue_body(finding()).anomaly() == "sample_hang"


def test_untrusted_text_stays_data_in_the_generic_body() -> None:
    """Mentions, references, quick actions, pipes, fences and Mermaid syntax from telemetry stay inert."""
    hostile = '@all #1 !2 ~bug /close | ``` \n```mermaid %%{init}%% --> ; " end'
    e = finding(title=hostile, evidence=[hostile], traces=[hostile],
                subject={"service": hostile, "operation": hostile, "entity": hostile, "version": hostile},
                data={"calls": 1, "hung": 1, "p95_ms": 1.0, "dependency": hostile},
                series=[Series(name=hostile, x_label=hostile, y_label=hostile, points=[Point(x=1, y=2)])])  # fmt: skip
    text = body_finding.description(e)
    prose = CODE_SPAN.sub("", text.split("```mermaid", 1)[0])
    assert not LIVE_REF.search(prose) and "/close" not in prose
    chart = text.split("```mermaid\n", 1)[1].split("\n```", 1)[0]
    assert "%%" not in chart and "-->" not in chart.replace(" 0 --> ", "") and ";" not in chart
    shown = text.split("<!-- trace-repro:state", 1)[0]  # (the hidden state is JSON inside an HTML comment)
    assert chart.count('"') % 2 == 0 and shown.count("```") == 2  # one fenced chart, nothing escaped it
    assert not LIVE_REF.search(body_finding.title(e))


async def test_a_finding_files_counts_closes_and_reopens_its_issue(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Filed with its type's label; a replay counts once; a later occurrence counts; FIXED closes it; an
    occurrence from before the fix's window is late (counted, closed); one after it reopens the issue."""
    sink = make_sink(occurrence_notes=5)
    e = finding()
    await deliver(sink, e, e)
    issue = one_issue(server)
    assert issue["title"] == body_finding.title(e)
    assert issue["labels"] == ["trace-repro", f"anomaly::{SAMPLE_TYPE.name}", "severity::high"]
    assert issue["description"] == body_finding.description(e)
    assert state_of(issue).occurrences == 1 and state_of(issue).kind == "finding"

    await deliver(sink, finding("occ-2", T0 + 60_000), finding("occ-2", T0 + 60_000))
    issue = one_issue(server)
    assert state_of(issue).occurrences == 2 and state_of(issue).last_seen_ms == T0 + 60_000
    assert "**Occurrences:** 2 · first seen" in issue["description"] and "on `payments`" in issue["description"]
    assert len(user_notes(server, issue["iid"])) == 1

    await deliver(sink, fixed(e, after_ms=T0 + 120_000))
    assert one_issue(server)["state"] == "closed"
    await deliver(sink, finding("occ-late", T0 + 90_000))  # before the verified window: late, not a recurrence
    issue = one_issue(server)
    assert issue["state"] == "closed" and state_of(issue).occurrences == 3
    await deliver(sink, finding("occ-back", T0 + 600_000))
    issue = one_issue(server)
    assert issue["state"] == "opened" and state_of(issue).occurrences == 4
    assert any(n.startswith(markdown.marker("recurrence-occ-back")) for n in user_notes(server, issue["iid"]))
    assert sink.telemetry.events["reopened"] == 1
    await deliver(sink, fixed(e, after_ms=T0 + 120_000))  # the replayed verdict does not close the reopened issue
    assert one_issue(server)["state"] == "opened"


async def test_the_scheme_labels_hold_every_registered_type(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The label set stays fixed: the registered types are in it, an unregistered type is ``anomaly::other``."""
    assert f"anomaly::{SAMPLE_TYPE.name}" in markdown.scheme_labels()
    sink = make_sink()
    await deliver(sink, finding(type="never_registered", fingerprint="fp-unknown"))
    [issue] = server.issues(tag=markdown.fingerprint_label("fp-unknown"))
    assert "anomaly::other" in issue["labels"]
