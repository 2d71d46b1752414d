"""Issues for people who follow them: whole trace ids linked to the trace UI, files relative to the repository linked at
the deployed ref, and a bounded label scheme (with the migration of the per-defect labels older releases made)."""

from __future__ import annotations

import pytest

from bench.gitlab_server import FakeGitLab
from sinks.gitlab import GitLabConfig, GitLabSink, body_repro, markdown
from sinks.gitlab.links import Links
from streamer import config
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import LINKS, built_at, deliver, incident, occurrence, regression, repro, state_of
from tests.gitlab.test_gitlab_factory import FakeContext, build

TRACE = "3c907cae300581207f0af176bb5ddcd0"


def test_a_trace_id_is_shown_whole_and_linked_only_when_it_is_hex() -> None:
    """The whole id, linked with the template; anything but a hex id is shown, never put in a URL."""
    assert LINKS.trace(TRACE) == f"[`{TRACE}`](https://tempo.example.com/trace/{TRACE})"
    assert Links().trace(TRACE) == f"`{TRACE}`"
    assert LINKS.trace("x) [y](https://evil") == "`x) [y](https://evil`"


def test_files_are_made_relative_and_linked_at_the_ref() -> None:
    """A path under a source root is made relative and linked at ``source_ref`` or the span's version; one under no
    root, one that climbs out, or one without a ref is shown unlinked; path and ref are percent-encoded."""
    blob = "https://gitlab.example.com/trace-repro/shop/-/blob"
    assert (
        LINKS.file("/builds/shop/app/jobs.py", 57, version="1.4.2")
        == f"[`app/jobs.py:57`]({blob}/1.4.2/app/jobs.py#L57)"
    )
    assert LINKS.file("app/jobs.py", 0, version="1.4.2") == f"[`app/jobs.py`]({blob}/1.4.2/app/jobs.py)"
    pinned = Links(LINKS.trace_url, LINKS.source_url, "abc123", LINKS.source_roots)
    assert pinned.file("/srv/other/a.py", 3, version="1.4.2") == f"[`a.py:3`]({blob}/abc123/a.py#L3)"
    assert LINKS.file("/home/ci/shop/a.py", 3, version="1.4.2") == "`/home/ci/shop/a.py:3`"
    assert LINKS.file("/builds/shop/../etc/passwd", 1, version="1.4.2") == "`../etc/passwd:1`"
    assert LINKS.file("app/jobs.py", 1, version="") == "`app/jobs.py:1`"
    assert (
        LINKS.file("app/a b(1).py", 2, version="v1/rc") == f"[`app/a b(1).py:2`]({blob}/v1%2Frc/app/a%20b%281%29.py#L2)"
    )


def test_bad_url_templates_are_refused_naming_the_key() -> None:
    """A template that is not http(s), lacks its placeholder or names an unknown one fails the config at start."""
    for key, value in [("TRACE_URL", "tempo/trace/{trace_id}"), ("TRACE_URL", "https://tempo/trace/{trace}"),
                       ("SOURCE_URL", "https://gitlab/x/-/blob/{ref}/{file}")]:  # fmt: skip
        with pytest.raises(config.ConfigError, match=f"gitlab.{key.lower()}"):
            config.load(env={f"TRACE_REPRO_GITLAB__{key}": value})
    explore = 'https://grafana/explore?left={"queries":[{"query":"{trace_id}"}]}'  # JSON braces pass
    assert (
        config.load(env={"TRACE_REPRO_GITLAB__TRACE_URL": explore}).section("gitlab", GitLabConfig).trace_url == explore
    )


def test_a_repaired_file_is_shown_relative_to_the_repository() -> None:
    """The repro note names a repaired file by its path in the repository, not the build machine's."""
    e = repro()
    moved = e.model_copy(
        update={"repairs": [r.model_copy(update={"file": f"/builds/shop/{r.file}"}) for r in e.repairs]}
    )
    note = body_repro.repro_note(moved, "t", None, LINKS)
    assert f"(`{e.repairs[0].file}`)" in note and "/builds/shop" not in note


async def test_the_filed_issue_links_traces_and_files_from_the_config(server: FakeGitLab) -> None:
    """Built from ``[gitlab]`` (trace_url, source_url, source_roots), the sink files an issue whose description shows
    both traces whole and linked, and the build machine's files relative and linked at the build's version."""
    cfg = GitLabConfig(url=server.url, project="trace-repro/shop", trace_url=LINKS.trace_url,
                       source_url=LINKS.source_url, source_roots=["/builds/shop"])  # fmt: skip
    sink = build(cfg, FakeContext(gitlab_token="glpat-TEST-s3cr3t-9f8e7d6c5b4a"))
    assert isinstance(sink, GitLabSink)
    try:
        e = built_at(incident(), "/builds/shop")
        await deliver(sink, e)
        [issue] = server.issues()
        text = issue["description"]
        for trace_id in (e.culprit.trace_id, e.victim.trace_id):
            assert f"[`{trace_id}`](https://tempo.example.com/trace/{trace_id})" in text
        assert "/blob/1.4.2/bench/shop/jobs.py#L57)" in text and "/builds/shop" not in text
    finally:
        await sink.close()


async def test_labels_are_a_fixed_set_however_many_defects(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """Twelve defects of three classes and a regression: each issue has the configured label, its anomaly and
    severity; the project's label list is the configured labels and the scheme's, not one per defect."""
    sink = make_sink(labels=("trace-repro",))
    kinds = ["lost_update", "invariant_violation", "duplicate_apply"]
    events = [incident(kinds[i % 3], fingerprint=f"{i:016x}", occurrence=f"{i:016x}") for i in range(12)]
    await deliver(sink, *events, regression("errors"))
    issues = server.issues()
    assert len(issues) == 13
    for e in events:
        [issue] = [i for i in issues if markdown.fingerprint_of(i["description"]) == e.fingerprint]
        assert issue["labels"] == ["trace-repro", f"anomaly::{e.anomaly}", f"severity::{e.severity}"]
    assert server.labels() == sorted(["trace-repro", *markdown.scheme_labels()])


async def test_an_issue_of_the_old_label_scheme_is_found_and_migrated(server: FakeGitLab, make_sink: SinkFactory
                                                                       ) -> None:  # fmt: skip
    """An issue an older release filed (labelled ``trace-repro::fp::<fp>``) gets the next occurrence, not a duplicate;
    its per-defect label is removed from it and deleted from the project (counted), the scheme's labels added."""
    e = incident()
    old_label = markdown.fingerprint_label(e.fingerprint)
    old = make_sink(labels=("trace-repro",))
    await deliver(old, e)
    [issue] = server.issues()
    with server.store.lock:  # as the older release left it: the tag as a label, no scheme labels, the list grown
        server.store.data["issues"][0]["labels"] = ["trace-repro", old_label]
        server.store.data["labels"].append({"id": 999, "name": old_label, "color": "#8E44AD", "description": ""})
    sink = make_sink(labels=("trace-repro",))  # a restart: nothing cached
    await deliver(sink, occurrence(e, 2))
    [issue] = server.issues()
    assert state_of(issue).occurrences == 2
    assert issue["labels"] == ["trace-repro", "anomaly::lost_update", "severity::high"]
    assert old_label not in server.labels()
    assert sink.telemetry.events["labels_migrated"] == 1
