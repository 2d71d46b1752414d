"""GitLab issues for incidents and regressions: one component folder (config, factory, sink, telemetry).

``sink`` queues and dispatches events by kind; ``issues`` keeps one issue per fingerprint; ``merge_requests``
opens the "Proves #N" merge request; ``body_*`` render each kind's Markdown (shared parts in ``markdown``, the
hidden issue state in ``state``, escaping in ``escape``); ``retry`` classifies and retries GitLab calls (and says when
to park the sink); ``patching`` applies a
repro's patch; ``config`` and ``factory`` make it a component.
"""

from typing import TYPE_CHECKING

from processors.api.lazy import exports
from sinks.gitlab.config import GitLabConfig
from sinks.gitlab.factory import FACTORY

if TYPE_CHECKING:
    from sinks.gitlab.issues import IssueRef
    from sinks.gitlab.retry import GitLabError, GitLabParkedError, GitLabPermanentError, GitLabRetryableError
    from sinks.gitlab.sink import GitLabQueueFull, GitLabSink

__all__ = [
    "FACTORY",
    "GitLabConfig",
    "GitLabError",
    "GitLabParkedError",
    "GitLabPermanentError",
    "GitLabQueueFull",
    "GitLabRetryableError",
    "GitLabSink",
    "IssueRef",
]

# python-gitlab and requests are imported on first use: a daemon without the sink never loads them.
__getattr__ = exports(
    __name__,
    {
        "sinks.gitlab.issues": ("IssueRef",),
        "sinks.gitlab.retry": ("GitLabError", "GitLabParkedError", "GitLabPermanentError", "GitLabRetryableError"),
        "sinks.gitlab.sink": ("GitLabQueueFull", "GitLabSink"),
    },
)
