"""Findings: what a detector found, one model every sink, the graph, the proof desk, alerts and MCP handle alike.

In the spirit of Sentry's issue occurrence. Every published finding is a :class:`Finding`: it says its type (an
entry a detector registers in :data:`FINDING_TYPES`), its fingerprint (stable across deploys: the same defect in
the next build is the same issue), a title, its subject (service, operation, entity, build), a severity, evidence
for people, typed data for machines, its event times and the proof contract that would show it fixed. Sinks read
findings through that interface only; what differs per type (a GitLab body, graph rows) is a renderer the
detector registers (:func:`register_renderer`), with a generic one for every type that registers none.

The two kinds that came first keep their own wire shape (``incident``: a collision on a row, ``regression``: a
latency or error regression) and implement the interface from their fields; every other detector publishes a
:class:`FindingEvent` (``kind`` ``finding``) whose ``type`` names its registered :class:`FindingType` and whose
``data`` validates against that type's model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, model_validator

from processors.model.base import SCHEMA_VERSION, Frozen, Published

Severity = Literal["high", "medium", "low"]
D = TypeVar("D", bound=Frozen)


class Subject(Frozen):
    """What a finding is about: the service and operation (route or span name) it was seen in, the entity it names
    (a row, a table, a dependency: ``""`` for none) and the build it was seen on."""

    service: str = ""
    operation: str = ""
    entity: str = ""
    version: str = ""


class Point(Frozen):
    """One point of a chart: ``x`` (a time in Unix ms, a concurrency, a count) and ``y``."""

    x: float
    y: float


class Series(Frozen):
    """A chart a finding carries for people (the GitLab issue draws it): named, with its axes and points."""

    name: str
    x_label: str
    y_label: str
    points: list[Point] = Field(default_factory=list, max_length=500)


class ContractRules(Frozen):
    """What must stop for the finding's fix to count as proven, and whose requests are the traffic: the proof
    desk turns these into an automatic :class:`~processors.model.contract.ProofContract`."""

    # counted by the judge per build: ``finding:<type>:<fingerprint>`` (a bare ``<type>:<fingerprint>`` reads as
    # that); see processors/connectors/proofs/contracts.py for every form
    signature: str = Field(min_length=3)
    service: str = ""
    routes: list[str] = Field(default_factory=list)  # the routes whose requests are the traffic
    must_start: str = ""  # an event the fix must start emitting ("": none)
    baseline_rate: float | None = None  # occurrences per request in the buggy build, when known


class Finding(Published):
    """The interface of every finding (see the module docstring); subclasses implement the methods."""

    fingerprint: str
    occurrence: str
    detected_at_unix_ms: float

    def finding_type(self) -> str:
        """The registered type's name (``lost_update``, ``n_plus_one``, ``latency_regression``)."""
        raise NotImplementedError

    def headline(self) -> str:
        """The title people see (a GitLab issue's title, a notification's subject)."""
        raise NotImplementedError

    def about(self) -> Subject:
        """What the finding is about."""
        raise NotImplementedError

    def level(self) -> Severity:
        raise NotImplementedError

    def seen_unix_ms(self) -> float:
        """The event time of this occurrence (first and last seen times of its issue)."""
        raise NotImplementedError

    def recurs_unix_ms(self) -> float:
        """The time that decides whether an occurrence after a verified fix is a recurrence (a later one) or a
        late one (from before the fix's verified window): by default its event time."""
        return self.seen_unix_ms()

    def where(self) -> str:
        """Where the latest occurrence happened, as the issue's occurrence line shows it (a row, a build)."""
        return self.about().entity or self.about().version

    def manifest_count(self) -> int:
        """1 when this occurrence did damage that happened (a collision's lost write), else 0."""
        return 0

    def rank(self) -> tuple[float, ...] | None:
        """How well this occurrence is evidenced, comparable between occurrences of one fingerprint (a better one
        replaces the one an issue shows), or None when occurrences are not ranked."""
        return None

    def rules(self) -> ContractRules | None:
        """The proof contract's rules for this finding, or None when the desk has none to make."""
        return None

    def affected_requests(self) -> int:
        """The requests this occurrence covers (a window's aggregate of lock waits covers each request that waited):
        what the proof judge counts as occurrences against the requests of the contract's routes."""
        return 1


class FindingEvent(Finding):
    """A finding of any registered type but the two first kinds (``kind`` ``finding``)."""

    identity: ClassVar[tuple[str, ...]] = ("occurrence",)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["finding"] = "finding"
    type: str = Field(min_length=1)  # a FindingType's name
    title: str
    subject: Subject
    severity: Severity = "medium"
    remedy: str = ""  # the remedy class the evidence supports (a FindingType.remedies entry)
    evidence: list[str] = Field(default_factory=list)  # for people, one fact per line
    data: dict[str, Any] = Field(default_factory=dict)  # for machines: the type's data model, validated
    series: list[Series] = Field(default_factory=list, max_length=8)
    traces: list[str] = Field(default_factory=list, max_length=20)  # example trace ids
    affected: int = Field(1, ge=1)  # the requests this occurrence covers (Finding.affected_requests)
    first_seen_unix_ms: float  # event time of the occurrence (its window's start, its first request)
    last_seen_unix_ms: float = 0.0
    build_first_seen_unix_ms: float = 0.0  # when the subject's build was first seen (0: unknown)
    contract: ContractRules | None = None

    @model_validator(mode="after")
    def _typed(self) -> FindingEvent:
        known = FINDING_TYPES.get(self.type)
        if known is not None:
            if known.data is not None:
                known.data.model_validate(self.data)
            if self.remedy and known.remedies and self.remedy not in known.remedies:
                raise ValueError(f"remedy {self.remedy!r} is not one of {self.type}'s {list(known.remedies)}")
        return self

    def finding_type(self) -> str:
        return self.type

    def headline(self) -> str:
        return self.title

    def about(self) -> Subject:
        return self.subject

    def level(self) -> Severity:
        return self.severity

    def seen_unix_ms(self) -> float:
        return self.first_seen_unix_ms

    def recurs_unix_ms(self) -> float:
        return self.build_first_seen_unix_ms or self.first_seen_unix_ms

    def rules(self) -> ContractRules | None:
        return self.contract

    def affected_requests(self) -> int:
        return self.affected


def data_of(finding: FindingEvent, model: type[D]) -> D:
    """A finding's ``data`` as its type's model."""
    return model.model_validate(finding.data)


# ---- the registry of types and renderers ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindingType:
    """A type of finding a detector registers: its name (``n_plus_one``), its title for people, the model its
    ``data`` validates against, the remedy classes its evidence can support and what it means."""

    name: str
    title: str
    description: str
    data: type[Frozen] | None = None
    remedies: tuple[str, ...] = ()
    severity: Severity = "medium"


FINDING_TYPES: dict[str, FindingType] = {}

# (surface, type) -> renderer: ``("gitlab_body", "n_plus_one")`` -> a function of the finding; see register_renderer.
RENDERERS: dict[tuple[str, str], Callable[[Any], Any]] = {}


def register_type(*types: FindingType) -> None:
    """Make types known in this process (idempotent for the same entry; a different entry of a name is an error)."""
    for t in types:
        known = FINDING_TYPES.setdefault(t.name, t)
        if known != t:
            raise ValueError(f"finding type {t.name!r} is already registered differently")


def register_renderer(surface: str, type_name: str, render: Callable[[Any], Any]) -> None:
    """Register how ``surface`` (``gitlab_body``, ``graph_rows``) shows findings of ``type_name`` (``*``: the
    surface's default for every type without one of its own)."""
    RENDERERS[(surface, type_name)] = render


def renderer(surface: str, type_name: str) -> Callable[[Any], Any] | None:
    """The renderer ``surface`` uses for ``type_name``: its own, else the surface's default, else None."""
    return RENDERERS.get((surface, type_name)) or RENDERERS.get((surface, "*"))


def renderer_for(surface: str, finding: Finding) -> Callable[[Any], Any] | None:
    """The renderer ``surface`` uses for ``finding``: its type's, else its published kind's (``incident``,
    ``regression``: one for every type of that kind), else the surface's default, else None."""
    kind = str(getattr(finding, "kind", ""))
    return RENDERERS.get((surface, finding.finding_type())) or RENDERERS.get((surface, kind)) or renderer(surface, "*")


__all__ = [
    "FINDING_TYPES",
    "RENDERERS",
    "ContractRules",
    "Finding",
    "FindingEvent",
    "FindingType",
    "Point",
    "Series",
    "Severity",
    "Subject",
    "data_of",
    "register_renderer",
    "register_type",
    "renderer",
    "renderer_for",
]
