"""Every event trace-repro publishes, by ``kind``: the registry sinks and consumers parse with.

Every event has ``schema_version`` and ``kind``; consumers must ignore unknown kinds and fields (new fields are
added without a version bump; a removal or a change of meaning bumps it). Keys on Kafka are the fingerprint.
Components that publish kinds of their own register them with :func:`register` (their factory does).
"""

from __future__ import annotations

import json

from processors.model.base import SCHEMA_VERSION, Published
from processors.model.contract import ProofContract
from processors.model.finding import Finding, FindingEvent
from processors.model.incident import AccessInfo, CommitInfo, IncidentEvent
from processors.model.regression import Evidence, PathShare, RegressionEvent
from processors.model.repro import DivergenceInfo, RepairInfo, ReproEvent, RunInfo
from processors.model.verdict import Receipt, VerdictEvent

OutputEvent = IncidentEvent | RegressionEvent | FindingEvent | ReproEvent | VerdictEvent | ProofContract

EVENT_TYPES: dict[str, type[Published]] = {
    "incident": IncidentEvent,
    "regression": RegressionEvent,
    "finding": FindingEvent,
    "repro": ReproEvent,
    "verdict": VerdictEvent,
    "contract": ProofContract,
}


def kind_of(model: type[Published]) -> str:
    """The ``kind`` literal a published model declares."""
    default = model.model_fields["kind"].default
    if not isinstance(default, str) or not default:
        raise TypeError(f"{model.__name__} declares no kind")
    return default


def register(*models: type[Published]) -> None:
    """Make kinds known to every sink and consumer in this process (idempotent; a clash is an error)."""
    for model in models:
        kind = kind_of(model)
        known = EVENT_TYPES.setdefault(kind, model)
        if known is not model:
            raise ValueError(f"event kind {kind!r} is already {known.__name__}")


def parse_event(value: bytes | None) -> Published | None:
    """An event from its JSON, or None for an empty value or a kind this process does not know.

    Raises ``ValueError`` (pydantic's ``ValidationError`` is one) for malformed JSON or a known kind's bad fields.
    """
    if not value:
        return None
    raw = json.loads(value)
    model = EVENT_TYPES.get(raw.get("kind", "")) if isinstance(raw, dict) else None
    return model.model_validate(raw) if model else None


__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "AccessInfo",
    "CommitInfo",
    "DivergenceInfo",
    "Evidence",
    "Finding",
    "FindingEvent",
    "IncidentEvent",
    "OutputEvent",
    "PathShare",
    "ProofContract",
    "Published",
    "Receipt",
    "RegressionEvent",
    "RepairInfo",
    "ReproEvent",
    "RunInfo",
    "VerdictEvent",
    "kind_of",
    "parse_event",
    "register",
]
