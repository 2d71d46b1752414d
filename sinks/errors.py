"""The two ways a sink can fail, as the runner that feeds it must know them."""

from __future__ import annotations


class RetryableSinkError(RuntimeError):
    """The sink could not deliver now (service down, rate limited, disk full): keep the input, retry later."""


class PermanentSinkError(RuntimeError):
    """The sink refused an event for good (a 4xx): retrying it unchanged cannot succeed; count it and move on."""
