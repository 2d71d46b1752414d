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
