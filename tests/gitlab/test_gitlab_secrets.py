"""The token never reaches a log line, an error message or a repr, even through faults and failures."""

from __future__ import annotations

import http.client
import io
import logging
from typing import Any

import pytest
import structlog

import sinks.gitlab.issues
import sinks.gitlab.merge_requests
import sinks.gitlab.retry
import sinks.gitlab.sink
from bench.gitlab_server import FakeGitLab
from sinks.gitlab import GitLabError
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import TOKEN, incident, occurrence, regression, repro, verdict


@pytest.fixture
def structlog_output(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Every structlog line of the sink, rendered as JSON into a buffer (independent of global configuration)."""
    buf = io.StringIO()
    logger = structlog.wrap_logger(
        structlog.PrintLogger(buf),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.BoundLogger,
    )
    for module in (sinks.gitlab.sink, sinks.gitlab.issues, sinks.gitlab.merge_requests, sinks.gitlab.retry):
        monkeypatch.setattr(module, "log", logger)
    return buf


async def test_token_is_never_logged(
    server: FakeGitLab,
    make_sink: SinkFactory,
    structlog_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run with 500s, 429s, drops, timeouts, a rejected token, an unknown project and a 422 logs no trace of the
    token."""
    caplog.set_level(logging.DEBUG)  # urllib3, requests and python-gitlab at their chattiest
    errors: list[str] = []
    sink = make_sink(timeout_s=0.2, merge_requests=True)
    e = incident()
    server.inject(r"/issues$", "error", method="POST", count=2, apply=True)
    server.inject(r"/notes$", "rate_limit", retry_after=1, count=2)
    server.inject(r"/issues/\d+$", "drop", method="PUT", count=1)
    server.inject(r"/uploads$", "hang", hang_s=0.5, count=1)
    for event in (e, occurrence(e, 2), repro(), verdict(), regression()):
        await sink.write(event)
    await sink.flush()
    server.inject(r"/issues$", "error", count=100)
    for bad in (
        make_sink(max_attempts=2),
        make_sink(token="glpat-wrong-" + TOKEN[::-1]),
        make_sink(project="nobody/nothing"),
    ):
        await bad.write(occurrence(e, 3))
        with pytest.raises(GitLabError) as info:
            await bad.flush()
        errors += [str(info.value), repr(info.value)]
    server.clear_faults()
    server.inject(r"/issues$", "error", method="POST", status=422)  # refused for its content: dropped
    refused = make_sink()
    await refused.write(incident(fingerprint="f" * 16))
    with pytest.raises(GitLabError) as info:
        await refused.flush()
    errors += [str(info.value), repr(info.value)]
    assert not await make_sink(token="x").healthcheck()

    logged = structlog_output.getvalue()
    out, err = capsys.readouterr()
    assert "gitlab.retry" in logged and "gitlab.unavailable" in logged and "gitlab.rejected" in logged  # capture works
    assert "gitlab.parked" in logged and "gitlab.unhealthy" in logged
    assert "gitlab.closed" in logged and "gitlab.merge_request" in logged  # of every module that logs
    assert "urllib3" in caplog.text or "Starting new HTTP connection" in caplog.text
    everything: list[Any] = [logged, caplog.text, out, err, *errors, repr(sink), str(sink)]
    assert not any(TOKEN in text for text in everything)
    assert http.client.HTTPConnection.debuglevel == 0  # python-gitlab's enable_debug() was never called
