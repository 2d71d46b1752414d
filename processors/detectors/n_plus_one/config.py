"""``[n_plus_one]``: one query per item in a loop, found in each closed trace."""

from __future__ import annotations

from pydantic import Field

from processors.findings.tally_detector import TallySection


class NPlusOneConfig(TallySection):
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
