"""``[retry_storm]``: one operation tried again after errors, within a trace or across a burst of traces."""

from __future__ import annotations

from pydantic import Field

from processors.findings.tally_detector import TallySection


class RetryStormConfig(TallySection):
    """Thresholds of the retry storm detector and the bounds of its per-window state."""

    enabled: bool = Field(True, description="find retry storms (calls repeated after errors, multiplying load)")
    min_attempts: int = Field(
        3, ge=2, description="attempts of one call in one request, each after a failed one: a storm within a trace"
    )
    min_burst_traces: int = Field(
        10, ge=2, description="requests of a window that retried one call after an error: a burst across traces ..."
    )
    min_amplification: float = Field(
        1.5, gt=1, description="... when the dependency also saw this many attempts per logical call in the window"
    )
    min_failed_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="... and this share of those attempts failed: a failing dependency (a retry that wins after one "
        "conflict, as serialization retries under contention do, is not a storm)",
    )
    backoff_floor_ms: float = Field(
        10.0, ge=0, description="retries sooner than this after the failure (on average) are immediate: no backoff"
    )
    max_operations: int = Field(
        10_000,
        ge=1,
        description="(service, route) request counters, and as many (service, route, dependency, operation) call "
        "counters, per window and input partition; more are dropped (counted)",
    )
