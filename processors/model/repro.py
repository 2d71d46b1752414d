"""A deterministic reproduction of an incident and the proof of its repair (``trace-repro.repros``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from processors.model.base import SCHEMA_VERSION, Frozen, Published


class RepairInfo(Frozen):
    """One planned code repair of one writer."""

    # row_lock | atomic_update | optimistic_version | stricter_isolation | idempotency_guard | share_lock |
    # repeatable_read | unique_insert
    strategy: str
    file: str
    function: str
    statement_before: str
    statement_after: str
    lock_before: str
    lock_after: str
    located_by: str = ""  # how the writer's code was found: code_attributes | stacktrace | route | statement


class RunInfo(Frozen):
    """One run of the generated test."""

    status: str  # failed (RED) | passed (GREEN) | error (the test itself broke)
    failure: str  # the assertion or exception that made it fail, as pytest reported it
    duration_ms: float


class DivergenceInfo(Frozen):
    """The first mismatch between the statements production ran and the statements the repro ran."""

    faithful: bool
    index: int | None
    expected: str | None
    actual: str | None
    mismatch: str | None  # ordering | missing | extra | different_rows | different_outcome


class ReproEvent(Published):
    """A deterministic reproduction of one incident, and the proof that its repair works."""

    identity: ClassVar[tuple[str, ...]] = ("fingerprint", "test_path")
    topic: ClassVar[str] = "repros"

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
    redacted: bool = False  # built from an incident with redacted values: it replays their placeholders
    # The evidence packet without the recorded statements and images (processors.repro.evidence): versions, settings,
    # production's services, and what the reduction removed.
    evidence: dict[str, Any] = {}
