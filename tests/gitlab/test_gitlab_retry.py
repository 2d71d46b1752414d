"""Backoff, Retry-After and error classification of the GitLab sink's retry loop."""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from email.utils import formatdate

import pytest
import requests
from aiokafka import AIOKafkaProducer
from gitlab.exceptions import (
    GitlabAuthenticationError,
    GitlabCreateError,
    GitlabGetError,
    GitlabHttpError,
    GitlabListError,
)
from pydantic import SecretStr

from bench.gitlab_server import FakeGitLab
from sinks.base import RetryableSinkError
from sinks.gitlab import GitLabSink
from sinks.gitlab.retry import (
    GitLabParkedError,
    GitLabPermanentError,
    GitLabRetryableError,
    Retrier,
    RetryPolicy,
    TransientHTTPError,
    classify,
    parse_retry_after,
)
from streamer.runtime.metrics import Metrics
from streamer.runtime.sink_runner import SinkRunner
from streamer.runtime.topics import create_topics
from tests.gitlab.helpers import PROJECT, TOKEN, RecordingSleep, incident
from tests.harness import harness_settings


def test_parse_retry_after() -> None:
    """Delta-seconds and HTTP dates parse; negatives clamp to zero; garbage and absence are None."""
    assert parse_retry_after("7") == 7.0 and parse_retry_after(" 1.5 ") == 1.5 and parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("") is None and parse_retry_after("soon") is None
    assert parse_retry_after("nan") is None
    now = 1_800_000_000.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30.0)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_parse_retry_after_never_raises_and_never_returns_nan() -> None:
    """Infinite, huge and far-future values come back as they are (the retrier caps them); an impossible date is
    no hint; nothing raises."""
    assert parse_retry_after("inf") == math.inf and parse_retry_after("1e12") == 1e12
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=0.0) == pytest.approx(253402300799.0)
    assert parse_retry_after("Wed, 21 Oct 99999 07:28:00 GMT") is None and parse_retry_after("-inf") == 0.0
    assert parse_retry_after("NaN") is None and parse_retry_after("Mon, 32 Foo 2020") is None


def test_backoff_is_jittered_exponential_and_capped() -> None:
    """Retry n waits between half and all of min(cap, base * 2^(n-1))."""
    policy = RetryPolicy(base_s=0.5, max_backoff_s=4.0)
    rng = random.Random(1)
    for attempt, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (9, 4.0)):
        waits = [policy.backoff(attempt, rng) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits) and len(set(waits)) > 1


def test_classify() -> None:
    """429, 5xx, timeouts and connection errors are transient; 401/403 park; other 4xx and anything else are
    permanent."""
    assert classify(TransientHTTPError(429, 5.0, "get"))[:2] == (True, 5.0)
    assert classify(requests.ReadTimeout())[0] and classify(requests.ConnectionError())[0]
    assert classify(requests.exceptions.ChunkedEncodingError())[0]
    assert classify(GitlabHttpError("x", 503))[0] and not classify(GitlabGetError("x", 404))[0]
    assert not classify(ValueError("bug"))[0]
    assert classify(GitlabHttpError("x", 401)).parks and classify(GitlabHttpError("x", 403)).parks
    assert not any(classify(GitlabCreateError("x", code)).parks for code in (400, 409, 413, 422))


class Flaky:
    """A step that raises the given exceptions in turn, then returns "done"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


async def test_retrier_honours_retry_after_and_recovers() -> None:
    """Transient failures are retried; a Retry-After longer than the backoff is waited in full."""
    sleep = RecordingSleep()
    retried: list[str] = []
    retrier = Retrier(
        RetryPolicy(max_attempts=4, base_s=0.1), sleep=sleep, rng=random.Random(3), on_retry=retried.append
    )
    step = Flaky(TransientHTTPError(429, 9.0, "post"), requests.ConnectionError(), TransientHTTPError(502, None, "get"))
    assert await retrier.run(step, op="test") == "done"
    assert step.calls == 4 and len(sleep.waits) == 3 and sleep.waits[0] == 9.0 and sleep.waits[1] < 1
    assert retrier.retries == 3 and retried == ["test"] * 3


async def test_retrier_gives_up_after_max_attempts() -> None:
    """The last transient failure becomes GitLabRetryableError after exactly max_attempts calls."""
    sleep = RecordingSleep()
    step = Flaky(*(requests.ReadTimeout() for _ in range(10)))
    with pytest.raises(GitLabRetryableError):
        await Retrier(RetryPolicy(max_attempts=3), sleep=sleep).run(step, op="test")
    assert step.calls == 3 and len(sleep.waits) == 2


async def test_retrier_does_not_retry_permanent_errors_and_redacts() -> None:
    """A 422 fails at once as GitLabPermanentError, its message passed through the redactor."""
    sleep = RecordingSleep()
    step = Flaky(GitlabCreateError("title sekrit is invalid", 422))
    retrier = Retrier(RetryPolicy(), sleep=sleep, redact=lambda s: s.replace("sekrit", "***"))
    with pytest.raises(GitLabPermanentError) as info:
        await retrier.run(step, op="test")
    assert step.calls == 1 and sleep.waits == [] and info.value.status == 422
    assert "sekrit" not in str(info.value) and "***" in str(info.value)


@pytest.mark.parametrize(
    ("error", "op"),
    [
        pytest.param(GitlabAuthenticationError("401 Unauthorized", 401), "issue.create", id="401"),
        pytest.param(GitlabGetError("token sekrit lacks rights", 403), "note.repro", id="403"),
        pytest.param(GitlabListError("404 Project Not Found", 404), "issue.lookup", id="404-project"),
        pytest.param(GitlabGetError("404 Not Found", 404), "project", id="404-loading-the-project"),
    ],
)
async def test_retrier_parks_on_auth_and_project_errors(error: Exception, op: str) -> None:
    """401, 403 and a 404 about the project fail at once as GitLabParkedError (retryable, ``parked``), redacted."""
    sleep = RecordingSleep()
    step = Flaky(error)
    retrier = Retrier(RetryPolicy(), sleep=sleep, redact=lambda s: s.replace("sekrit", "***"))
    with pytest.raises(GitLabParkedError) as info:
        await retrier.run(step, op=op)
    assert isinstance(info.value, RetryableSinkError) and info.value.parked
    assert step.calls == 1 and sleep.waits == [] and info.value.status == error.response_code  # type: ignore[attr-defined]
    assert "sekrit" not in str(info.value)


def test_a_404_on_an_issue_is_about_that_event() -> None:
    """A 404 for an issue (deleted meanwhile) neither parks nor is transient: the sink looks the issue up again."""
    found = classify(GitlabGetError("404 Issue Not Found", 404), op="issue.occurrence")
    assert not found.transient and not found.parks


FAR_FUTURE = "Fri, 31 Dec 9999 23:59:59 GMT"


@pytest.mark.parametrize("header", ["inf", "1e12", FAR_FUTURE])
async def test_a_retry_after_beyond_the_cap_fails_the_step_asking_for_the_cap(header: str) -> None:
    """A Retry-After of infinity, of 30,000 years or a date in year 9999 fails the step at once, and the caller is
    told to wait ``max_retry_after_s``, not that long."""
    sleep = RecordingSleep()
    step = Flaky(TransientHTTPError(429, parse_retry_after(header), "post"))
    with pytest.raises(GitLabRetryableError) as info:
        await Retrier(RetryPolicy(max_retry_after_s=90.0), sleep=sleep).run(step, op="issue.create")
    assert info.value.retry_after_s == 90.0 and step.calls == 1 and sleep.waits == []


@pytest.mark.engines
@pytest.mark.parametrize(
    "header",
    ["inf", "1e12", FAR_FUTURE, "-5", "nan", formatdate(time.time() - 3600, usegmt=True)],
    ids=["inf", "huge", "date-far-ahead", "negative", "nan", "date-past"],
)
async def test_the_sink_runner_files_the_issue_whatever_retry_after_says(
    header: str, server: FakeGitLab, kafka_bootstrap: str, falkordb_url: str
) -> None:
    """The local GitLab answers the first new issue with 429 and this ``Retry-After``; the GitLab sink, run by the
    sink runner from Kafka with ``max_retry_after_s`` 1 s, files the issue soon after (never wedged, never stalled
    for the header's duration)."""
    settings = harness_settings(kafka_bootstrap, falkordb_url)
    topic = f"incidents-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, {topic: 1})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, incident().model_dump_json().encode())
    finally:
        await producer.stop()
    server.inject(r"/issues$", "rate_limit", method="POST", retry_after=header)
    sink = GitLabSink(server.url, PROJECT, SecretStr(TOKEN), max_retry_after_s=1.0, backoff_s=0.05, timeout_s=5)
    runner = SinkRunner("gitlab", sink, settings=settings, topics=[topic], metrics=Metrics(), backoff_s=0.05,
                        max_backoff_s=0.2)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        deadline = time.monotonic() + 30
        while not server.issues():
            assert not task.done(), f"the runner ended: {task.exception()!r}"
            assert time.monotonic() < deadline, f"no issue filed 30 s after a 429 with Retry-After: {header}"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    assert len(server.issues()) == 1
