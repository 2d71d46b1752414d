"""A cross-trace collision on one row, as published on ``trace-repro.incidents``."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from processors.model.anomaly import title
from processors.model.base import SCHEMA_VERSION, Frozen
from processors.model.finding import Finding, Severity, Subject


class AccessInfo(Frozen):
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
    entity: str = ""  # the row it touched (``table:*`` for a predicate statement)
    predicate: str = ""  # a predicate statement's WHERE as read (empty for a statement naming its row by key)
    idempotency_key: str = ""  # the request's idempotency key, when the span carried one
    line: int = 0  # code.line.number, or the located line
    located_by: str = ""  # code_attributes | stacktrace | route | statement ("" = not located)
    candidates: list[str] = []  # the functions it may be, when the code could not be located to one
    # How its row was found: ``bound`` (the span's parameters), ``by_change`` (the row change credited to it),
    # ``by_trace`` (what a later write of its trace proved), ``predicate`` (not found: ``may match`` rows).
    keying: str = "bound"
    key_candidates: int = 1  # rows it may be (> 1: ambiguous, none of them shown as fact)
    key_confidence: float = 1.0
    sampling: float | None = None  # the probability its trace was kept with; None: unknown (no tracestate, no sampler)


class CommitInfo(Frozen):
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


class IncidentEvent(Finding):
    """A cross-trace collision on one row: one occurrence of a defect identified by its fingerprint."""

    identity: ClassVar[tuple[str, ...]] = ("occurrence",)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["incident"] = "incident"
    fingerprint: str
    occurrence: str
    anomaly: str  # an Anomaly: lost_update | invariant_violation | duplicate_apply | write_skew | phantom | read_skew
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
    adya: str = ""  # Adya's phenomenon: G-single, G2-item, G2
    entities: list[str] = []  # every row involved (two for write skew, phantoms and read skew)
    correlated: bool = True  # False: the row changes were not credited to the traces; classified by statements
    # The chance a pair like this one is observed at all: the product of culprit's and victim's sampling, an unknown
    # one counted as 1 (then an upper bound: ``pair_sampling_known`` False). 0.01: a hundred such pairs per one seen.
    pair_probability: float = 1.0
    pair_sampling_known: bool = False
    # The configured invariant an invariant violation broke, as configured (``stock >= 0``): typed data for the repro
    # compiler, which never reads it back from ``damage``. "" when none broke (the victim failed) or, for events
    # published before the field, unknown.
    invariant: str = ""

    def finding_type(self) -> str:
        return self.anomaly

    def headline(self) -> str:
        return f"{title(self.anomaly)} on {self.entity}"

    def about(self) -> Subject:
        c = self.culprit
        return Subject(service=c.service, operation=c.route or c.operation, entity=self.entity, version=c.version)

    def level(self) -> Severity:
        return "high" if self.severity == "high" else "low"

    def seen_unix_ms(self) -> float:
        return self.culprit.start_unix_ms

    def where(self) -> str:
        return self.entity

    def manifest_count(self) -> int:
        return int(self.manifest)

    def rank(self) -> tuple[float, ...] | None:
        """(manifest, row changes correlated, confidence)."""
        return (float(self.manifest), float(self.correlated), float(self.confidence))
