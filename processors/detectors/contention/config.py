"""``[contention]``: operations whose latency rises with their own in-flight concurrency (a lock or a pool)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class ContentionConfig(Section):
    """How many (concurrency, latency) pairs, how strong a correlation and how large an effect make a finding."""

    enabled: bool = Field(True, description="run the contention detector")
    min_pairs: int = Field(200, ge=20, description="recent (concurrency, latency) pairs of an operation before a test")
    min_windows: int = Field(2, ge=1, description="windows the pairs must come from")
    max_pairs: int = Field(2_000, ge=100, description="recent pairs kept per operation (the oldest go first)")
    max_requests: int = Field(
        5_000, ge=100, description="requests per operation per window whose concurrency is measured (counted past it)"
    )
    alpha: float = Field(1e-4, gt=0, lt=1, description="significance level of the stratified Spearman test")
    min_rho: float = Field(0.4, gt=0, le=1, description="smallest rank correlation that counts")
    min_ratio: float = Field(
        1.5, gt=1, description="fitted latency at the p90 concurrency over that at the p10 concurrency must reach this"
    )
    max_operations: int = Field(
        2_000, ge=1, description="operations whose pairs are kept; the least recent go (counted)"
    )
