"""Fixtures of the GitLab sink tests: the fake GitLab server in a thread, sinks with a recording sleep."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from bench.gitlab_server import FakeGitLab
from sinks.gitlab import GitLabSink
from tests.gitlab.helpers import PROJECT, TOKEN, RecordingSleep


@pytest.fixture
def server() -> Iterator[FakeGitLab]:
    """A fresh fake GitLab (one project, token required) served from a thread."""
    with FakeGitLab(token=TOKEN, project=PROJECT) as srv:
        yield srv


@pytest.fixture
def sleeps() -> RecordingSleep:
    return RecordingSleep()


SinkFactory = Callable[..., GitLabSink]


@pytest.fixture
async def make_sink(server: FakeGitLab, sleeps: RecordingSleep) -> AsyncIterator[SinkFactory]:
    """Builds sinks against ``server`` (short timeouts, recorded backoff) and closes them afterwards."""
    made: list[GitLabSink] = []

    def build(**kw: Any) -> GitLabSink:
        options: dict[str, Any] = {"timeout_s": 5.0, "max_attempts": 5, "sleep": sleeps, "rng": random.Random(7)}
        options.update(kw)
        url = options.pop("url", server.url)
        token = options.pop("token", TOKEN)
        sink = GitLabSink(url, options.pop("project", PROJECT), SecretStr(token), **options)
        made.append(sink)
        return sink

    yield build
    for sink in made:
        await sink.close()
