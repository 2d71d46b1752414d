"""``[blocked_by]``: the blocked-by detector (stage 2)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class BlockedByConfig(Section):
    """The blocked-by detector: DB statements that waited on a row lock another trace held (stage 2)."""

    enabled: bool = Field(True, description="find statements that waited on another trace's row lock")
    min_wait_ms: float = Field(
        100.0, gt=0, description="a statement shorter than this is not a lock wait worth naming (the floor)"
    )
    release_ms: float = Field(
        50.0,
        ge=0,
        description="how long after the holder's commit (beyond the clock skew) the waiting statement may return",
    )
    min_blocked: int = Field(
        2, ge=1, description="lock waits of one (blocked, blocking) pair in one window before it is a finding"
    )
    window_s: float = Field(60.0, gt=0, description="the windows lock waits are aggregated over, per pair")
    settle_s: float = Field(1.0, ge=0, description="extra event time to wait for row changes before judging")
    max_hold_s: float = Field(
        30.0, gt=0, description="the longest lock hold looked for: row history older than this is pruned"
    )
    history_per_entity: int = Field(64, ge=2, description="lock-taking statements and commits remembered per row")
    max_entities: int = Field(100_000, ge=1, description="rows with a history (least recently used evicted)")
    max_traces: int = Field(
        100_000, ge=1, description="recent traces whose statement times are kept (how long a holder worked in the DB)"
    )
    max_pairs: int = Field(10_000, ge=1, description="(blocked, blocking) pairs aggregated in the open windows")
