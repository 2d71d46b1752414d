"""``[fanout]``: N calls to one dependency in a request that run k at a time."""

from __future__ import annotations

from pydantic import Field

from processors.findings.tally_detector import TallySection


class FanoutConfig(TallySection):
    """Thresholds of the serialized fan-out detector and the bounds of its per-window state."""

    enabled: bool = Field(True, description="find serialized fan-out (N calls to one dependency run k at a time)")
    min_calls: int = Field(5, ge=2, description="calls of one operation to one dependency under one parent span")
    max_concurrency_ratio: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="the calls must run at most this share of them at a time (k <= ratio x N: k much less than N)",
    )
    min_saving_ms: float = Field(
        50.0, ge=0, description="what running the calls all at once would save on the request's critical path"
    )
    min_saving_share: float = Field(
        0.2, ge=0, le=1, description="... and that saving as a share of the request's duration, at least"
    )
