"""Production text cannot act in GitLab: span attributes and row values carrying ``@all``, ``/close`` at a line start,
``#N``, ``!N``, ``~label``, ``%milestone`` or a URL flow through the GitLab sink to the fake server, and no title,
description or note it posted holds a live mention, reference or quick action."""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from bench.gitlab_server import FakeGitLab
from processors.model.outputs import IncidentEvent, Published
from sinks.gitlab import GitLabSink, escape
from tests.gitlab.helpers import FIXTURES, PROJECT, TOKEN, RecordingSleep, incident, regression, repro, verdict

# Crafted text: what an attacker controls in a span attribute (function, route, exception, statement, parameters)
# or a row value. Numbers that the sink's own references (#1, !1) cannot produce.
CRAFT = ('ok\n/close\n/assign @all\n@all @devops-team #31337 group/proj#31337 !31338 ~evil ~"x y" %m1 %"v 2" &7 $9 '
         "^alert https://gitlab.example/g/p/-/issues/31337 `tick` | pipe\u2028/label ~evil")  # fmt: skip

# GitLab's reference syntax (https://docs.gitlab.com/user/markdown/#gitlab-specific-references) and quick actions.
LIVE = {
    "quick action": re.compile(r"^[ \t]*/[a-z_]+", re.MULTILINE),
    "mention": re.compile(r"(?<![\w.+-])@[A-Za-z0-9_][\w.-]*"),
    "issue": re.compile(r"(?<![\w&])#\d+"),
    "merge request": re.compile(r"(?<![\w])!\d+"),
    "label": re.compile(r"(?<![\w])~(?:\d+|\"[^\"]+\"|[A-Za-z_][\w.?&-]*)"),
    "milestone": re.compile(r"(?<![\w])%(?:\d+|\"[^\"]+\"|[A-Za-z_][\w.-]*)"),
    "epic": re.compile(r"(?<![\w])&\d+"),
    "snippet": re.compile(r"(?<![\w])\$\d+"),
    "alert": re.compile(r"(?<![\w])\^alert#?\d*|(?<![\w])\^[A-Za-z]\w*"),
    "url": re.compile(r"\b(?:https?|ftp)://"),
}
OURS = {"#1", "!1"}  # the issue the sink filed and the merge request it opened: references it makes itself


def inert_removed(text: str) -> str:
    """``text`` without what GitLab neither links nor executes: HTML comments (closed at the first ``-->``),
    fenced code blocks, and inline code spans (a backtick run closed by a run of the same length)."""
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    text = re.sub(r"^```[^\n]*\n.*?^```[ \t]*$", " ", text, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", " ", text)


def live_forms(text: str) -> list[tuple[str, str]]:
    """Every live reference, mention or quick action in ``text`` that the sink did not make itself."""
    visible = inert_removed(text)
    found = [(kind, m.group()) for kind, pattern in LIVE.items() for m in pattern.finditer(visible)]
    return [(kind, form) for kind, form in found if form not in OURS]


def crafted_incident() -> IncidentEvent:
    """The lost-update fixture with the crafted text in every attacker-controlled string."""
    e = incident()

    def access(a: Any) -> Any:
        return a.model_copy(update={"function": CRAFT, "route": CRAFT, "exception": CRAFT, "statement": CRAFT,
                                    "service": CRAFT, "version": CRAFT, "operation": CRAFT, "lock": CRAFT,
                                    "params": [CRAFT, 1], "file": CRAFT})  # fmt: skip

    commits = [c.model_copy(update={"after": {**(c.after or {}), "note": CRAFT}, "tx_id": CRAFT}) for c in e.commits]
    return e.model_copy(update={
        "anomaly": CRAFT, "table": CRAFT, "entity": CRAFT, "summary": CRAFT, "damage": CRAFT, "evidence": [CRAFT],
        "culprit": access(e.culprit), "victim": access(e.victim), "writers": [access(w) for w in e.writers],
        "accesses": [access(a) for a in e.accesses], "commits": commits,
    })  # fmt: skip


@pytest.fixture
def server() -> Iterator[FakeGitLab]:
    with FakeGitLab(token=TOKEN, project=PROJECT) as srv:
        yield srv


@pytest.fixture
async def sink(server: FakeGitLab) -> AsyncIterator[GitLabSink]:
    s = GitLabSink(server.url, PROJECT, SecretStr(TOKEN), timeout_s=5.0, max_attempts=5, sleep=RecordingSleep(),
                   rng=random.Random(7), merge_requests=True)  # fmt: skip
    yield s
    await s.close()


async def _deliver(sink: GitLabSink, *events: Published) -> None:
    for e in events:
        await sink.write(e)
    await sink.flush()


def posted(server: FakeGitLab) -> dict[str, str]:
    """Every title, description and note the sink posted, by where it is."""
    texts: dict[str, str] = {}
    for issue in server.issues():
        texts[f"issue {issue['iid']} title"] = issue["title"]
        texts[f"issue {issue['iid']} description"] = issue["description"]
        for n, body in enumerate(server.notes(issue["iid"])):
            texts[f"issue {issue['iid']} note {n}"] = body["body"]
    for mr in server.merge_requests():
        texts[f"MR {mr['iid']} title"] = mr["title"]
        texts[f"MR {mr['iid']} description"] = mr["description"]
    return texts


def test_the_checker_sees_what_gitlab_would_link() -> None:
    """The regexes find every crafted form in the raw text, and none once it is a code span or plain()."""
    kinds = {kind for kind, _ in live_forms(CRAFT)}
    assert kinds == set(LIVE), set(LIVE) - kinds
    assert live_forms(escape.code(CRAFT)) == [] and live_forms(escape.plain(CRAFT)) == []
    assert live_forms("<!-- @all --> @all") == [("mention", "@all")]  # a comment ends at its first -->


async def test_an_incident_files_nothing_live(server: FakeGitLab, sink: GitLabSink) -> None:
    """Title, description, the occurrence, repro and verdict notes, and the merge request: nothing live."""
    server.seed_file("bench/shop/jobs.py", (FIXTURES / "jobs_before.py.txt").read_text())
    e = crafted_incident()
    again = e.model_copy(update={"occurrence": e.occurrence[:8] + "00000002"})
    r = repro().model_copy(update={
        "test_path": "tests/repro/test_@all_#31337.py", "anomaly": CRAFT,
        "red": repro().red.model_copy(update={"failure": CRAFT, "status": CRAFT}),
        "divergence": repro().divergence.model_copy(update={"faithful": False, "mismatch": CRAFT, "expected": CRAFT,
                                                            "actual": CRAFT}),
        "repairs": [x.model_copy(update={"function": CRAFT, "file": CRAFT, "statement_before": CRAFT})
                    for x in repro().repairs],
    })  # fmt: skip
    v = verdict(outcome="NOT_FIXED", reason=CRAFT, service=CRAFT, version=CRAFT, commit=CRAFT, contract=CRAFT)
    v = v.model_copy(update={"receipt": v.receipt.model_copy(update={"still_happens_at": [CRAFT], "test": CRAFT})})
    await _deliver(sink, e, again, r, v)
    texts = posted(server)
    assert any(k.startswith("MR ") for k in texts) and sum(" note " in k for k in texts) >= 3
    assert any("@all" in t for t in texts.values())  # the crafted text is shown, inert
    for where, text in texts.items():
        assert live_forms(text) == [], (where, live_forms(text))


async def test_a_regression_files_nothing_live(server: FakeGitLab, sink: GitLabSink) -> None:
    """A regression whose operation, version and signature carry the crafted text: its issue holds nothing live."""
    e = regression(operation=CRAFT, service=CRAFT, version=CRAFT, previous_version=CRAFT, commit=CRAFT,
                   summary=CRAFT, window=CRAFT)  # fmt: skip
    await _deliver(sink, e)
    texts = posted(server)
    assert texts
    for where, text in texts.items():
        assert live_forms(text) == [], (where, live_forms(text))
