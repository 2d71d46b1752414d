"""The ``[gitlab]`` config section: where issues are filed, how hard GitLab is retried, what else is opened.

The token is not here: it is the secret ``gitlab_token`` (``TRACE_REPRO_GITLAB_TOKEN``), read through
``Context.secret`` by :mod:`sinks.gitlab.factory`, never logged; or it is in the file ``token_file`` names, read
again by every health check so that a rotated token takes effect without a restart. An empty ``url`` turns the
sink off.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from processors.api.component import Section

_TRACE_FIELDS = {"trace_id"}
_SOURCE_FIELDS = {"ref", "path", "line", "service"}
_PLACEHOLDER = re.compile(r"\{(\w*)\}")


def _template(value: str, allowed: set[str], required: str) -> str:
    """A URL template: http(s), only ``allowed`` placeholders, ``required`` among them. Other braces pass (a Grafana
    Explore URL holds JSON): placeholders are replaced as text, never through ``str.format``."""
    if not value:
        return value
    if not value.startswith(("https://", "http://")):
        raise ValueError("expected an http(s) URL template")
    names = set(_PLACEHOLDER.findall(value))
    if required not in names or not names <= allowed:
        raise ValueError(f"expected the placeholder {{{required}}} and only {', '.join(sorted(allowed))}")
    return value


class GitLabConfig(Section):
    """Where incidents and regressions are filed as GitLab issues (token: ``gitlab_token``)."""

    url: str = Field("", description="GitLab base URL (https://gitlab.example.com); empty = sink off")
    project: str = Field("", description='project path "group/name" or numeric id')
    labels: list[str] = Field(
        default_factory=lambda: ["trace-repro"],
        description="labels on every issue; trace-repro adds only anomaly::<class> and severity::<high|low>, a fixed "
        "set (an issue is found by the fingerprint in its description, not by a label)",
    )
    trace_url: str = Field(
        "", description="trace UI link of a trace id, {trace_id} (https://tempo.example.com/trace/{trace_id}); "
        "empty = full ids, not linked"
    )  # fmt: skip
    source_url: str = Field(
        "", description="link of a code location: {path} and optionally {ref}, {line}, {service} "
        "(https://gitlab.example.com/shop/shop/-/blob/{ref}/{path}#L{line}); empty = paths, not linked"
    )  # fmt: skip
    source_ref: str = Field(
        "", description="the {ref} of source_url (a branch, tag or commit); empty = the span's service.version"
    )
    source_roots: list[str] = Field(
        default_factory=list, description="absolute source directories of the build machines (/app, /builds/shop), "
        "stripped from code.file.path so files show and link relative to the repository"
    )  # fmt: skip
    timeout_s: float = Field(10.0, gt=0, description="per-request connect/read timeout")
    max_attempts: int = Field(5, ge=1, description="attempts per step on 429/5xx/timeouts/connection errors")
    backoff_s: float = Field(0.5, gt=0, description="first retry delay; doubles per attempt, with jitter")
    max_backoff_s: float = Field(30.0, gt=0, description="cap of the exponential retry delay")
    max_retry_after_s: float = Field(
        120.0,
        ge=0,
        description="the longest Retry-After honoured: a longer one (inf, a date far ahead) fails the "
        "flush at once and is waited only this long before the next attempt",
    )
    occurrence_notes: int = Field(5, ge=0, description="repeat occurrences that get a note; later ones only count")
    merge_requests: bool = Field(False, description="open a 'Proves #N' merge request for proven repros")
    target_branch: str = Field("", description="MR target; default: the project's default branch")
    ssl_verify: bool = Field(True, description="verify GitLab's TLS certificate")
    max_queued: int = Field(
        1000, ge=1, description="events kept while GitLab is down or the sink is parked; more are read again later"
    )
    contract_poll_s: float = Field(
        60.0, ge=0, description="how often the open issues' proof contract sections are read back (a person's edit "
        "becomes the contract the proof desk and the merge request use); 0 = only when an event touches the issue"
    )  # fmt: skip
    token_file: str = Field("", description="read the token from this file (re-read by each health check)")
    confidential: bool = Field(
        False, description="file issues as confidential (only project members see them; existing issues unchanged)"
    )
    releases: bool = Field(
        True, description="a FIXED verdict on a build whose version is a tag of the project (1.4.2 or v1.4.2) adds "
        "its receipt to that tag's release (created when missing)"
    )  # fmt: skip
    rollback: Literal["off", "deployments", "webhook"] = Field(
        "off", description="what a WORSE verdict does besides its note: 'deployments' re-runs the deploy job of "
        "rollback_environment's last successful deployment before the WORSE build (GitLab's rollback); 'webhook' "
        "POSTs the verdict and its receipt as JSON to rollback_webhook_url; once per verdict, noted on the issue"
    )  # fmt: skip
    rollback_environment: str = Field("", description="the GitLab environment rolled back (rollback = deployments)")
    rollback_webhook_url: str = Field("", description="where rollback = webhook POSTs the verdict (http or https)")
    rollback_webhook_header: str = Field(
        "X-Trace-Repro-Token", description="the header that carries the webhook's secret"
    )
    rollback_webhook_secret_env: str = Field(
        "", description="name of the environment variable holding the webhook's secret (never logged); empty = none"
    )

    @model_validator(mode="after")
    def _rollback_target(self) -> GitLabConfig:
        if self.rollback == "deployments" and not self.rollback_environment:
            raise ValueError("rollback_environment: required with rollback = 'deployments'")
        if self.rollback == "webhook" and not self.rollback_webhook_url.startswith(("https://", "http://")):
            raise ValueError("rollback_webhook_url: an http(s) URL is required with rollback = 'webhook'")
        return self

    @field_validator("trace_url")
    @classmethod
    def _trace_template(cls, value: str) -> str:
        return _template(value, _TRACE_FIELDS, "trace_id")

    @field_validator("source_url")
    @classmethod
    def _source_template(cls, value: str) -> str:
        return _template(value, _SOURCE_FIELDS, "path")


__all__ = ["GitLabConfig"]
