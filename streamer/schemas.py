"""Versioned output events (pydantic): what trace-repro publishes on its Kafka topics.

Every event has ``schema_version`` and ``kind``; consumers must ignore unknown fields (new fields are added
without a version bump; a removal or a change of meaning bumps it). Keys on Kafka are the incident fingerprint.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION: Literal[1] = 1


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AccessInfo(_Event):
    """One statement of one trace on the entity, as evidence."""

    trace_id: str
    span_id: str
    service: str
    version: str
    function: str
    file: str
    route: str
    operation: str
    lock: str
    statement: str
    params: list[Any]
    set_values: dict[str, Any]
    start_unix_ms: float
    offset_ms: float  # from the culprit's conflicting write
    error: bool
    exception: str
    http_status: int


class CommitInfo(_Event):
    """One committed row change (Debezium), with the trace it was correlated with."""

    lsn: int
    tx_id: str
    commit_unix_ms: int
    offset_ms: float
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    trace_id: str
    span_id: str
    correlation: str  # trace_column | tx_id | values_time | none
    skew_ms: float | None


class IncidentEvent(_Event):
    """A cross-trace collision on one row: one occurrence of a defect identified by its fingerprint."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["incident"] = "incident"
    fingerprint: str
    occurrence: str
    anomaly: str  # lost_update | invariant_violation | duplicate_apply | write_skew
    severity: str  # high (manifest) | low (latent)
    manifest: bool
    entity: str
    table: str
    window_ms: float
    summary: str
    damage: str
    confidence: float
    culprit: AccessInfo
    victim: AccessInfo
    writers: list[AccessInfo]
    accesses: list[AccessInfo]
    commits: list[CommitInfo]
    evidence: list[str]
    detected_at_unix_ms: float  # event time (the watermark) when it was judged


class RepairInfo(_Event):
    """One planned code repair of one writer."""

    strategy: str  # row_lock | atomic_update | optimistic_version | stricter_isolation | idempotency_guard
    file: str
    function: str
    statement_before: str
    statement_after: str
    lock_before: str
    lock_after: str


class RunInfo(_Event):
    """One run of the generated test."""

    status: str  # failed (RED) | passed (GREEN) | error (the test itself broke)
    failure: str  # the assertion or exception that made it fail, as pytest reported it
    duration_ms: float


class DivergenceInfo(_Event):
    """The first mismatch between the statements production ran and the statements the repro ran."""

    faithful: bool
    index: int | None
    expected: str | None
    actual: str | None
    mismatch: str | None  # ordering | missing | extra | different_rows | different_outcome


class ReproEvent(_Event):
    """A deterministic reproduction of one incident, and the proof that its repair works."""

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["repro"] = "repro"
    fingerprint: str
    occurrence: str
    anomaly: str
    level: str  # sql | app
    test_path: str
    test_source: str
    red: RunInfo
    green: RunInfo | None
    patch: str  # unified diff of the planned repairs
    repairs: list[RepairInfo]
    sql_rewrites: list[dict[str, str]]
    divergence: DivergenceInfo
    proven: bool  # faithful, RED before the repair and GREEN after it


class Receipt(_Event):
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


class VerdictEvent(_Event):
    """Whether a deployed build fixed the defect its proof contract names, judged on that build's telemetry."""

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


OutputEvent = IncidentEvent | ReproEvent | VerdictEvent
