"""``[n_plus_one]``: one query per item in a loop, found in each closed trace."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class NPlusOneConfig(Section):
    """Thresholds of the N+1 detector and the bounds of its per-window state."""

    enabled: bool = Field(True, description="find N+1 queries (one statement shape repeated in a loop per request)")
    min_repeats: int = Field(
        5,
        ge=2,
        description="statements of one shape, one after the other under one parent span (with parameters: that "
        "many different parameter values), before a request counts as running them in a loop",
    )
    min_repeated_ms: float = Field(
        20.0, ge=0, description="the repeated statements must take at least this long together in the request"
    )
    max_fingerprints: int = Field(
        1_000, ge=1, description="findings tallied per window and input partition; more are dropped (counted)"
    )
    max_operations: int = Field(
        10_000, ge=1, description="(service, route) request counters per window and input partition (counted)"
    )
    max_points: int = Field(200, ge=1, le=500, description="chart points (affected requests) kept per finding")
    shape_cache: int = Field(4_096, ge=1, description="statement shapes remembered by statement text (counted)")
