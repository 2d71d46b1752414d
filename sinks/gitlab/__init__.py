"""GitLab issues for incidents: the sink, the issue body (with a Mermaid diagram), retries."""

from sinks.gitlab.retry import GitLabError, GitLabPermanentError, GitLabRetryableError
from sinks.gitlab.sink import GitLabSink

__all__ = ["GitLabError", "GitLabPermanentError", "GitLabRetryableError", "GitLabSink"]
