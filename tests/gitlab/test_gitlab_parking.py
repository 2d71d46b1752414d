"""The GitLab sink parks on 401, 403 and 404-on-the-project: it keeps every event (bounded, de-duplicated), reports
the state once, and delivers everything kept, in order and once, when GitLab accepts it again."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import structlog

import sinks.gitlab.retry
import sinks.gitlab.sink
from bench.gitlab_server import FakeGitLab
from processors.api.telemetry import Telemetry
from processors.model.outputs import IncidentEvent
from sinks.base import RetryableSinkError
from sinks.gitlab import GitLabConfig, GitLabParkedError, GitLabQueueFull, GitLabSink, markdown
from sinks.gitlab.factory import create
from streamer.config import load
from streamer.runtime.context import RuntimeContext
from streamer.runtime.metrics import Metrics
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import PROJECT, TOKEN, incident, occurrence


def distinct(n: int) -> list[IncidentEvent]:
    """``n`` incidents of ``n`` different defects (one issue each)."""
    return [incident(fingerprint=f"{i:016x}", occurrence=f"{i:016x}") for i in range(n)]


def filed(server: FakeGitLab) -> list[str]:
    """The fingerprints of the issues on the server, in the order they were filed (by iid)."""
    issues = sorted(server.issues(), key=lambda i: int(i["iid"]))
    return [str(markdown.fingerprint_of(i["description"])) for i in issues]


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Every structlog line of the sink and its retrier, rendered into a buffer."""
    buf = io.StringIO()
    logger = structlog.wrap_logger(structlog.PrintLogger(buf), processors=[structlog.processors.JSONRenderer()])
    for module in (sinks.gitlab.sink, sinks.gitlab.retry):
        monkeypatch.setattr(module, "log", logger)
    return buf


async def test_an_expired_token_parks_and_a_restored_one_delivers_everything_in_order_once(
    server: FakeGitLab, make_sink: SinkFactory, logged: io.StringIO
) -> None:
    """GitLab starts answering 401 half-way: the sink parks (nothing dropped, no retries burnt), keeps what it is
    given, logs the state once over three failed flushes; with the token accepted again all ten are filed in order."""
    sink = make_sink()
    events = distinct(10)
    for e in events[:3]:
        await sink.write(e)
    await sink.flush()
    server.token = "glpat-someone-else"  # the sink's token is no longer accepted
    for e in events[3:]:
        await sink.write(e)
    for _ in range(3):
        with pytest.raises(GitLabParkedError) as info:
            await sink.flush()
        assert isinstance(info.value, RetryableSinkError) and info.value.status == 401
    assert sink.parked == "http 401" and sink.pending == 7 and sink.telemetry.dropped["rejected"] == 0
    assert "retries" not in sink.telemetry.events and not await sink.healthcheck()
    server.token = TOKEN
    assert await sink.healthcheck()
    await sink.flush()
    assert sink.parked is None and sink.pending == 0
    assert filed(server) == [e.fingerprint for e in events]
    assert logged.getvalue().count('"gitlab.parked"') == 1 and logged.getvalue().count('"gitlab.resumed"') == 1
    assert sink.telemetry.events["parked"] == 1 and sink.telemetry.events["resumed"] == 1


async def test_a_403_on_filing_parks_until_the_rights_come_back(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """403 on creating issues (the token's user lost its role) parks the sink with the event kept."""
    sink = make_sink()
    server.inject(r"/issues$", "error", method="POST", status=403, count=2)
    events = distinct(2)
    for e in events:
        await sink.write(e)
    for _ in range(2):
        with pytest.raises(GitLabParkedError):
            await sink.flush()
    assert sink.parked == "http 403" and sink.pending == 2 and server.issues() == []
    await sink.flush()
    assert sink.parked is None and filed(server) == [e.fingerprint for e in events]


async def test_a_missing_project_parks_and_the_probe_sees_it_back(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """The project disappears (404 Project Not Found on every call, by id and by path): parked and unhealthy; once
    it is back, healthy again, and the kept occurrence is counted on the issue found again."""
    sink = make_sink()
    e = incident()
    await sink.write(e)
    await sink.flush()
    project = server.store.data["project"]
    with server.store.lock:
        project.update(id=999, path_with_namespace="trace-repro/deleted")
    await sink.write(occurrence(e, 2))
    with pytest.raises(GitLabParkedError) as info:
        await sink.flush()
    assert info.value.status == 404 and sink.parked == "http 404" and sink.pending == 1
    assert not await sink.healthcheck()
    with server.store.lock:
        project.update(id=1, path_with_namespace="trace-repro/shop")
    assert await sink.healthcheck()
    await sink.flush()
    assert sink.parked is None and len(server.issues()) == 1
    assert "Occurrences:** 2" in server.issues()[0]["description"]


async def test_a_rotated_token_file_unparks_without_a_restart(
    server: FakeGitLab, make_sink: SinkFactory, tmp_path: Path, logged: io.StringIO
) -> None:
    """The server accepts only a new token: the sink parks; the new token is written to ``token_file`` and the next
    health check takes it; the kept events are filed; neither token ever appears in a log line or an error."""
    old, new = TOKEN, "glpat-ROTATED-7a6b5c4d3e2f1a0b"
    token_file = tmp_path / "token"
    token_file.write_text(old + "\n")
    sink = make_sink(token_file=token_file)
    server.token = new
    events = distinct(3)
    for e in events:
        await sink.write(e)
    with pytest.raises(GitLabParkedError) as info:
        await sink.flush()
    assert not await sink.healthcheck()
    token_file.write_text(new + "\n")
    assert await sink.healthcheck()
    await sink.flush()
    assert filed(server) == [e.fingerprint for e in events] and sink.telemetry.events["token_reloads"] == 1
    texts = [logged.getvalue(), str(info.value), repr(info.value), repr(sink)]
    assert not any(secret in text for secret in (old, new) for text in texts)


async def test_the_queue_is_bounded_and_deduplicated(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """An event queued twice is kept once (``duplicates``); past ``max_queued`` a write is refused (retryable) and
    counted as a ``max_queued`` drop, and the queue keeps exactly the first events, in order."""
    telemetry = Telemetry("gitlab")
    sink = make_sink(max_queued=4, telemetry=telemetry)
    server.token = "glpat-someone-else"
    events = distinct(6)
    for e in events[:4]:
        await sink.write(e)
        await sink.write(e)
    assert sink.pending == 4 and telemetry.events["duplicates"] == 4
    for e in events[4:]:
        with pytest.raises(GitLabQueueFull) as info:
            await sink.write(e)
        assert isinstance(info.value, RetryableSinkError)
    assert sink.pending == 4 and telemetry.dropped["max_queued"] == 2 and telemetry.state["queued"] == 4
    with pytest.raises(GitLabParkedError):
        await sink.flush()
    server.token = TOKEN
    await sink.flush()
    assert filed(server) == [e.fingerprint for e in events[:4]] and telemetry.state["queued"] == 0


async def test_token_file_wins_over_the_secret_in_the_factory(server: FakeGitLab, tmp_path: Path) -> None:
    """With ``token_file`` set and readable the component is built with the file's token (GitLab accepts it, not
    the one in the environment); with neither a readable file nor a secret it is not built at all."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    ctx = RuntimeContext(load(None, env={"TRACE_REPRO_GITLAB_TOKEN": "glpat-stale"}), Metrics(), lambda: 0)
    config = GitLabConfig(url=server.url, project=PROJECT, token_file=str(token_file))
    sink = create(config, ctx)
    assert isinstance(sink, GitLabSink) and sink.max_queued == 1000
    try:
        assert await sink.healthcheck()
    finally:
        await sink.close()
    no_secret = RuntimeContext(load(None, env={}), Metrics(), lambda: 0)
    assert create(config.model_copy(update={"token_file": str(tmp_path / "missing")}), no_secret) is None
