"""A latency or error regression of one operation (``trace-repro.incidents``, kind ``regression``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from processors.model.base import SCHEMA_VERSION, Frozen
from processors.model.finding import Finding, Severity, Subject


class Evidence(Frozen):
    """One test that flagged the regression, with the numbers it ran on."""

    comparison: str  # baseline | version
    metric: str  # errors | latency
    test: str
    before_version: str
    after_version: str
    before_windows: list[str]
    after_window: str
    before_requests: int
    before_errors: int
    after_requests: int
    after_errors: int
    before_rate: float
    after_rate: float
    before_p50_ms: float
    after_p50_ms: float
    before_p95_ms: float
    after_p95_ms: float
    before_samples: int
    after_samples: int
    statistic: float
    effect: float | None  # rate ratio after/before (None = infinite), or P(after > before) for latency
    p_value: float
    p_adjusted: float  # Benjamini-Hochberg over every test of the window
    ratio_low: float | None  # exact 95% CI of the rate ratio after/before; None = unbounded
    ratio_high: float | None


class PathShare(Frozen):
    """One owner's share of the slowest requests' critical path, before and after."""

    owner: str
    before: float
    after: float
    delta: float


class RegressionEvent(Finding):
    """A latency or error regression of one operation, with the tests that show it."""

    identity: ClassVar[tuple[str, ...]] = ("occurrence",)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["regression"] = "regression"
    fingerprint: str  # stable: service + operation + signature + kind
    occurrence: str  # this window and version
    service: str
    operation: str
    signature: str  # error:<label>:<exception> | latency:<label>
    metric: str  # errors | latency
    version: str
    previous_version: str  # "" when only the rolling baseline flagged it
    commit: str  # vcs.ref.head.revision of the build
    window: str
    window_start_unix_ms: float
    window_end_unix_ms: float
    summary: str
    evidence: list[Evidence]
    critical_path: list[PathShare]
    detected_at_unix_ms: float
    build_first_seen_unix_ms: float = 0.0  # when this build's first request of the service was seen (0: unknown)

    def finding_type(self) -> str:
        return f"{'latency' if self.metric == 'latency' else 'error'}_regression"

    def headline(self) -> str:
        return self.summary

    def about(self) -> Subject:
        return Subject(service=self.service, operation=self.operation, version=self.version)

    def level(self) -> Severity:
        return "medium"

    def seen_unix_ms(self) -> float:
        return self.window_start_unix_ms

    def recurs_unix_ms(self) -> float:
        return self.build_first_seen_unix_ms or self.window_start_unix_ms

    def where(self) -> str:
        return self.version
