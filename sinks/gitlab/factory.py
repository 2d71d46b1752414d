"""The GitLab sink as a component: its config section ``[gitlab]``, the output topics it consumes, how it is built.

Enabled when ``gitlab.url`` is set. Built from the section, the token (the secret ``gitlab_token``, or the file
``gitlab.token_file``) and the component's telemetry (``component="gitlab"`` on /metrics); without a token
:func:`create` returns None and the runtime logs that the sink is disabled.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from processors.api.component import Context, Factory
from sinks.gitlab.config import GitLabConfig
from sinks.gitlab.links import Links

if TYPE_CHECKING:
    from sinks.gitlab.rollback import RollbackHook
    from sinks.gitlab.sink import GitLabSink


def rollback_hook(config: GitLabConfig) -> RollbackHook | None:
    """The WORSE verdicts' hook of ``config`` (None: off); the webhook's secret is read from its environment variable
    here, once, and held only by the hook (whose ``repr`` leaves it out)."""
    from sinks.gitlab.rollback import RollbackHook

    if config.rollback == "off":
        return None
    secret = os.environ.get(config.rollback_webhook_secret_env, "") if config.rollback_webhook_secret_env else ""
    return RollbackHook(config.rollback, config.rollback_environment, config.rollback_webhook_url,
                        config.rollback_webhook_header, secret, config.timeout_s)  # fmt: skip


def create(config: GitLabConfig, ctx: Context) -> GitLabSink | None:
    """The sink of ``config``, or None when there is no token (``token_file``, when set and readable, wins over the
    secret ``gitlab_token``). The sink's module (python-gitlab, requests) is imported here, not before."""
    from sinks.gitlab.sink import GitLabSink

    token = ctx.secret("gitlab_token")
    if config.token_file:
        with contextlib.suppress(OSError):
            text = Path(config.token_file).read_text().strip()
            token = SecretStr(text) if text else token
    if token is None or not token.get_secret_value():
        return None
    try:
        publish = ctx.publish  # a person's edit of an issue's contract is published on trace-repro.contracts
    except RuntimeError:
        publish = None
    return GitLabSink(
        config.url,
        config.project,
        token,
        labels=tuple(config.labels),
        timeout_s=config.timeout_s,
        max_attempts=config.max_attempts,
        backoff_s=config.backoff_s,
        max_backoff_s=config.max_backoff_s,
        max_retry_after_s=config.max_retry_after_s,
        occurrence_notes=config.occurrence_notes,
        merge_requests=config.merge_requests,
        target_branch=config.target_branch or None,
        ssl_verify=config.ssl_verify,
        max_queued=config.max_queued,
        token_file=config.token_file or None,
        confidential=config.confidential,
        links=Links(config.trace_url, config.source_url, config.source_ref, tuple(config.source_roots)),
        rollback=rollback_hook(config),
        releases=config.releases,
        telemetry=ctx.telemetry("gitlab"),
        publish=publish,
        contract_poll_s=config.contract_poll_s,
    )


FACTORY: Factory[GitLabConfig, GitLabSink | None] = Factory(
    kind="sink",
    name="gitlab",
    config=GitLabConfig,
    create=create,
    topics=("incidents", "repros", "verdicts"),
    enabled=lambda c: bool(c.url),
)

__all__ = ["FACTORY", "create"]
