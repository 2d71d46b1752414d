"""``[hangs]``: hops with no timeout: calls far beyond their hop's recent durations, or timeouts never answered."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class HangConfig(Section):
    """When a call is hung (far beyond its hop's recent distribution, without an error) and how many make a finding."""

    enabled: bool = Field(True, description="run the hang detector")
    factor: float = Field(10.0, gt=1, description="a call is hung past this many times its hop's recent p99 ...")
    min_hang_s: float = Field(5.0, gt=0, description="... and past this absolute floor (seconds)")
    min_baseline: int = Field(100, ge=10, description="recent calls of a hop before its distribution can judge a call")
    baseline_size: int = Field(512, ge=32, description="recent call durations kept per hop (the distribution)")
    per_window: int = Field(64, ge=8, description="durations per hop per window added to the hop's recent distribution")
    min_calls: int = Field(3, ge=1, description="hung calls (or unanswered timeouts) of a hop per window to report it")
    max_hops: int = Field(
        2_000, ge=1, description="hops whose distribution is kept; the least recent is dropped (counted)"
    )
