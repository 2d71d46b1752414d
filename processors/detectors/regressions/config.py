"""``[regressions]``: windowed service statistics and the regression detector."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class RegressionConfig(Section):
    """Windowed service statistics (stage 1) and the regression tests on every instance's share of them (stage 2)."""

    reservoir_size: int = Field(256, ge=8, description="latency samples kept per (operation, version) per window")
    slow_traces: int = Field(32, ge=1, description="slowest requests per key per window whose critical path is kept")
    max_signatures: int = Field(64, ge=1, description="error signatures per key per window; the rest fold into (other)")
    max_sites: int = Field(16, ge=1, description="code sites kept per error signature per window")
    baseline_windows: int = Field(10, ge=1, description="rolling baseline: how many previous windows")
    fdr: float = Field(0.05, gt=0, lt=1, description="Benjamini-Hochberg false discovery rate across operations")
    min_requests: int = Field(30, ge=1, description="requests per side before a count test runs")
    min_samples: int = Field(20, ge=3, description="latency samples per side before the rank test runs")
    min_latency_ratio: float = Field(1.2, ge=1, description="p50 or p95 must grow this much to be a latency regression")
    seed: int = Field(0, description="seed of the latency reservoirs' sampling (the same input gives the same tests)")
