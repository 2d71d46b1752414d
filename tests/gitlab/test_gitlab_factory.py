"""The GitLab sink as a component: its config section, its factory, and the sink the factory builds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from bench.gitlab_server import FakeGitLab
from processors.api.component import Context, GraphQueries, Publish, Section
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.model.base import Published
from sinks.gitlab import FACTORY, GitLabConfig, GitLabRetryableError, GitLabSink
from tests.gitlab.helpers import PROJECT, TOKEN, deliver, incident, user_notes

C = TypeVar("C", bound=BaseModel)


class FakeContext:
    """A Context with secrets from a dict and one Telemetry per component; nothing else is available."""

    def __init__(self, **secrets: str) -> None:
        self.secrets = {k: SecretStr(v) for k, v in secrets.items()}
        self.telemetries: dict[str, Telemetry] = {}
        self.published: list[Published] = []

    @property
    def clock(self) -> Callable[[], int]:
        return lambda: 0

    @property
    def state_events(self) -> StateEvents:
        return NO_EVENTS

    def section(self, name: str, model: type[C]) -> C:
        raise AssertionError(f"the GitLab sink reads no other section ({name})")

    def telemetry(self, component: str) -> Telemetry:
        return self.telemetries.setdefault(component, Telemetry(component))

    def secret(self, name: str) -> SecretStr | None:
        return self.secrets.get(name)

    @property
    def graph(self) -> GraphQueries:
        raise AssertionError("the GitLab sink reads no graph")

    @property
    def publish(self) -> Publish:
        """Records what the sink publishes (a person's edit of an issue's proof contract)."""

        async def publish(event: Published) -> None:
            self.published.append(event)

        return publish


def build(config: GitLabConfig, ctx: FakeContext) -> GitLabSink | None:
    context: Context = ctx  # FakeContext implements the protocol (mypy checks this assignment)
    return FACTORY.create(config, context)


def test_factory_declares_a_sink_on_the_output_topics() -> None:
    """``gitlab`` is a sink on incidents, repros and verdicts, configured by GitLabConfig, enabled by a URL."""
    assert (FACTORY.kind, FACTORY.name, FACTORY.config) == ("sink", "gitlab", GitLabConfig)
    assert tuple(FACTORY.topics) == ("incidents", "repros", "verdicts") and tuple(FACTORY.events) == ()
    assert not FACTORY.enabled(GitLabConfig()) and FACTORY.enabled(GitLabConfig(url="https://gitlab.example.com"))


def test_config_is_a_documented_strict_section() -> None:
    """Every field is described; the section is frozen, rejects unknown keys by name, and checks its bounds."""
    assert issubclass(GitLabConfig, Section)
    undocumented = [name for name, f in GitLabConfig.model_fields.items() if not f.description]
    assert undocumented == []
    c = GitLabConfig()
    assert (c.url, c.project, c.labels, c.timeout_s, c.max_attempts, c.occurrence_notes) == (
        "",
        "",
        ["trace-repro"],
        10.0,
        5,
        5,
    )
    assert (c.merge_requests, c.target_branch, c.ssl_verify, c.max_retry_after_s) == (False, "", True, 120.0)
    with pytest.raises(ValidationError, match="tokne"):
        GitLabConfig.model_validate({"url": "https://gitlab.example.com", "tokne": "x"})
    with pytest.raises(ValidationError, match="max_attempts"):
        GitLabConfig(max_attempts=0)
    with pytest.raises(ValidationError):
        c.url = "changed"  # type: ignore[misc]


@pytest.mark.parametrize("secrets", [{}, {"gitlab_token": ""}], ids=["missing", "empty"])
def test_no_token_builds_nothing(secrets: dict[str, str]) -> None:
    """Without a token the factory returns None (the runtime logs that the sink is disabled)."""
    assert build(GitLabConfig(url="https://gitlab.example.com", project="g/p"), FakeContext(**secrets)) is None


async def test_built_sink_uses_the_section_the_token_and_the_component_telemetry(server: FakeGitLab) -> None:
    """The built sink files with the section's labels, retries as configured, and counts into ctx.telemetry."""
    ctx = FakeContext(gitlab_token=TOKEN)
    config = GitLabConfig(url=server.url, project=PROJECT, labels=["trace-repro", "race"], max_attempts=2,
                          backoff_s=0.001, max_backoff_s=0.002, occurrence_notes=0, timeout_s=5)  # fmt: skip
    sink = build(config, ctx)
    assert isinstance(sink, GitLabSink)
    try:
        e = incident()
        await deliver(sink, e)
        [issue] = server.issues()
        assert issue["labels"][:2] == ["trace-repro", "race"]
        telemetry = ctx.telemetries["gitlab"]
        assert sink.telemetry is telemetry and telemetry.events["issues_created"] == 1
        await deliver(sink, e.model_copy(update={"occurrence": "another"}))
        assert user_notes(server, issue["iid"]) == []  # occurrence_notes=0: counted, no note
        server.inject(r"/issues$", "error", method="GET", count=100)
        await sink.write(incident("duplicate_apply"))
        with pytest.raises(GitLabRetryableError, match="after 2 attempts"):
            await sink.flush()
        assert telemetry.events["retries"] == 1
    finally:
        await sink.close()


async def test_confidential_files_confidential_issues(server: FakeGitLab) -> None:
    """``confidential = true`` files issues GitLab shows only to project members; the default files public ones."""
    for confidential in (True, False):
        config = GitLabConfig(url=server.url, project=PROJECT, occurrence_notes=0, confidential=confidential)
        sink = build(config, FakeContext(gitlab_token=TOKEN))
        assert isinstance(sink, GitLabSink)
        try:
            e = incident(fingerprint=f"confidential-{confidential}")
            await deliver(sink, e)
            [issue] = server.issues(tag=f"trace-repro::fp::confidential-{confidential}`")
            assert issue["confidential"] is confidential
        finally:
            await sink.close()
