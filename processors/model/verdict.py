"""A proof verdict on a deployed build, with its receipt (``trace-repro.verdicts``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from processors.model.base import SCHEMA_VERSION, Frozen, Published


class Receipt(Frozen):
    """The numbers behind a verdict, so that anyone can check it."""

    before_errors: int
    before_requests: int
    after_errors: int
    after_requests: int
    test: str  # e.g. "one-sided conditional binomial (exact)"
    p_value: float | None
    interval: list[float] | None
    must_start_seen: int
    still_happens_at: list[str]
    requests_needed: int
    window_start_unix_ms: float
    window_end_unix_ms: float
    alpha: float = 0.05  # the contract's level, spent over ``looks``
    looks: int = 2
    floor: int = 0  # the zero-error floor from the before rate's upper bound (0: no before count)
    rule: str = ""  # the decision rule applied, in words
    threshold_ms: float | None = None  # latency contracts: a request over it is slow (errors/requests count those)
    baseline_slow: int | None = None  # latency: slow requests of the build before the regression
    baseline_requests: int | None = None
    baseline_p_value: float | None = None  # latency: the test of "still slower than the baseline build"
    # The sampling each compared build's requests were kept with, by version: "1", "0.1", "unknown" (no sampling
    # information on the spans: not the same as 1), or "mixed: 0.1 (900 requests, 2 errors), 1 (...)".
    sampling: dict[str, str] = {}
    # How the judged build was told apart from the others: "version" (service.version), "commit" (the deploy's
    # vcs.ref.head.revision), "digest" (its image digest), "mark" (a `trace-repro deploy mark` time boundary).
    build_identified_by: str = ""


class VerdictEvent(Published):
    """Whether a deployed build fixed the defect its proof contract names, judged on that build's telemetry."""

    identity: ClassVar[tuple[str, ...]] = ("fingerprint", "version", "outcome")
    topic: ClassVar[str] = "verdicts"

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["verdict"] = "verdict"
    fingerprint: str
    contract: str  # the signature that must stop
    service: str
    version: str
    commit: str
    outcome: str  # FIXED | NOT_FIXED | WORSE | INSUFFICIENT
    rollback: bool
    reason: str
    receipt: Receipt
