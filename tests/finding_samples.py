"""A finding of a type no sink knows (registered here, as a detector registers its own): what the sinks, the graph
and MCP must handle through the ``Finding`` interface alone."""

from __future__ import annotations

from typing import Any

from processors.model.base import Frozen
from processors.model.finding import ContractRules, FindingEvent, FindingType, Point, Series, Subject, register_type

T0 = 1_800_000_000_000.0  # ms


class HangData(Frozen):
    """The sample type's data: the damage as values."""

    calls: int
    hung: int
    p95_ms: float
    dependency: str


SAMPLE_TYPE = FindingType(
    name="sample_hang",
    title="Hang (sample)",
    description="calls to a dependency that end far beyond their distribution without an error",
    data=HangData,
    remedies=("add_timeout", "circuit_breaker"),
)
register_type(SAMPLE_TYPE)


def finding(occurrence: str = "occ-1", at_ms: float = T0, **changes: Any) -> FindingEvent:
    """One occurrence of the sample type's defect at ``at_ms`` (fields replaced by ``changes``)."""
    fields: dict[str, Any] = {
        "fingerprint": "fp-sample-hang",
        "occurrence": occurrence,
        "detected_at_unix_ms": at_ms + 60_000,
        "type": SAMPLE_TYPE.name,
        "title": "GET /checkout hangs on payments: 20 of 320 calls",
        "subject": Subject(service="checkout", operation="GET /checkout", entity="payments", version="1.4.2"),
        "severity": "high",
        "remedy": "add_timeout",
        "evidence": ["20 of 320 calls to payments ended after 30 s without an error", "no client timeout set"],
        "data": {"calls": 320, "hung": 20, "p95_ms": 30_012.5, "dependency": "payments"},
        "series": [
            Series(
                name="Latency of calls to payments",
                x_label="minute",
                y_label="p95 (ms)",
                points=[Point(x=0, y=41.0), Point(x=1, y=30_012.5), Point(x=2, y=29_870.0)],
            ),
        ],
        "traces": ["ab" * 16, "cd" * 16],
        "first_seen_unix_ms": at_ms,
        "last_seen_unix_ms": at_ms + 30_000,
        "contract": ContractRules(signature="sample_hang:fp-sample-hang", service="checkout", routes=["GET /checkout"]),
    }
    return FindingEvent.model_validate({**fields, **changes})
