"""Proof contracts: what a build must show in production before its fix counts as proven.

A contract names a *signature* that must stop and an event the fix must start emitting (``must_start``: a log
record's ``event.name``, or the name of a span), how long to watch a new build (``watch_s``, event time) and the
traffic floor ``min_requests``: with the defect's rate ``p0`` in the buggy build, ``n`` requests without one
occurrence rule it out at level ``alpha`` once ``n >= ln(alpha) / ln(1 - p0)`` (the zero-error rule).

Signatures:

* ``error:<route>:<exception type>`` (or ``error:<route>:HTTP <status>``): a request error on a route, as the
  service statistics name it; ``<route>`` is ``<METHOD> <route>``, the bare route, or ``*`` for any route of the
  service (a defect reachable from several routes). The exception matches by its qualified name or its last part.
* ``<anomaly>:<table>:<function>+<function>``: a collision (``lost_update:orders:shop.handlers.capture_payment+
  shop.jobs.expire_cart``), the functions of the culprit and the victim, sorted and deduplicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from processors.graph_rows import Row
from processors.regressions import RegressionEvent
from processors.stat_tests import zero_error_floor
from streamer.schemas import AccessInfo, IncidentEvent

DEFAULT_ALPHA = 0.05
DEFAULT_WATCH_S = 3600.0
DEFAULT_P0 = 0.01  # the rate assumed when nothing better is known: 299 requests at alpha 0.05
DEFAULT_MIN_REQUESTS = zero_error_floor(DEFAULT_P0, DEFAULT_ALPHA)
ANY_ROUTE = "*"


class ProofContract(BaseModel):
    """One incident's proof obligation, published on ``trace-repro.contracts`` (keyed by fingerprint)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    kind: Literal["contract"] = "contract"
    signature: str = Field(min_length=3)
    fingerprint: str = Field(min_length=1)  # the incident's
    must_start: str = ""  # the event the fix must start emitting; "" = none promised (e.g. a lock added)
    watch_s: float = Field(DEFAULT_WATCH_S, gt=0)
    min_requests: int = Field(DEFAULT_MIN_REQUESTS, ge=1)
    alpha: float = Field(DEFAULT_ALPHA, gt=0, lt=1)
    baseline_rate: float | None = None  # p0 the floor came from, when known
    service: str = ""  # "" = the first service the signature is seen in
    version: str = ""  # the build the defect was seen on; "" = the first build the signature is seen in
    routes: list[str] = Field(default_factory=list)  # collisions: the routes whose requests are the traffic
    reports: list[str] = Field(default_factory=list)  # what reports the defect in code (exception types): the gate
    issue: int | None = None
    created_unix_ms: float = 0.0


# ---- signatures ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ErrorSignature:
    route: str  # "<METHOD> <route>", "<route>" or "*"
    error: str  # exception type, "HTTP <status>" or "error"

    def matches_route(self, label: str, operation: str) -> bool:
        return self.route in (ANY_ROUTE, label, operation)

    def matches_error(self, error: str) -> bool:
        """Exact, or the contract names the exception by its last dotted part."""
        return error == self.error or error.endswith("." + self.error) or self.error.endswith("." + error)

    def __str__(self) -> str:
        return f"error:{self.route}:{self.error}"


@dataclass(frozen=True, slots=True)
class CollisionSignature:
    anomaly: str
    table: str
    functions: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.anomaly}:{self.table}:{'+'.join(self.functions)}"


def parse_signature(signature: str) -> ErrorSignature | CollisionSignature:
    """An ``error:...`` or a collision signature; ValueError for anything else."""
    if signature.startswith("error:"):
        route, sep, error = signature.removeprefix("error:").rpartition(":")
        if not sep or not route or not error:
            raise ValueError(f"error signature must be error:<route>:<exception>, got {signature!r}")
        return ErrorSignature(route, error)
    parts = signature.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"signature must be error:<route>:<exception> or <anomaly>:<table>:<f>+<g>: {signature!r}")
    anomaly, table, functions = parts
    return CollisionSignature(anomaly, table, tuple(sorted({f for f in functions.split("+") if f})))


def _who(a: AccessInfo) -> str:
    return a.function or a.service


def collision_signature(incident: IncidentEvent) -> str:
    """``<anomaly>:<table>:<culprit function>+<victim function>`` (sorted, deduplicated)."""
    functions = sorted({_who(incident.culprit), _who(incident.victim)})
    return str(CollisionSignature(incident.anomaly, incident.table, tuple(functions)))


def short_exception(name: str) -> str:
    """``bench.shop.errors.Oversold`` -> ``Oversold``."""
    return name.rsplit(".", 1)[-1]


# ---- builders ------------------------------------------------------------------------------------------------


def min_requests_for(p0: float | None, alpha: float = DEFAULT_ALPHA) -> int:
    """The zero-error floor for a defect of rate ``p0`` (the default floor when the rate is unknown or 0)."""
    if p0 is None or p0 <= 0:
        return zero_error_floor(DEFAULT_P0, alpha)
    return zero_error_floor(min(p0, 1.0), alpha)


def contract_from_incident(
    incident: IncidentEvent,
    must_start: str,
    *,
    occurrences: int | None = None,
    requests: int | None = None,
    watch_s: float = DEFAULT_WATCH_S,
    alpha: float = DEFAULT_ALPHA,
    issue: int | None = None,
    now_ms: float = 0.0,
) -> ProofContract:
    """A collision incident's contract; ``occurrences / requests`` (on its routes, in the buggy build) is p0."""
    p0 = occurrences / requests if occurrences is not None and requests else None
    reports = sorted({short_exception(a.exception) for a in (incident.victim, incident.culprit) if a.exception})
    return ProofContract(
        signature=collision_signature(incident),
        fingerprint=incident.fingerprint,
        must_start=must_start,
        watch_s=watch_s,
        min_requests=min_requests_for(p0, alpha),
        alpha=alpha,
        baseline_rate=p0,
        service=incident.culprit.service,
        version=incident.victim.version or incident.culprit.version,
        routes=sorted({r for r in (incident.culprit.route, incident.victim.route) if r}),
        reports=reports,
        issue=issue,
        created_unix_ms=now_ms,
    )


def contract_from_regression(
    event: RegressionEvent,
    must_start: str,
    *,
    any_route: bool = False,
    watch_s: float = DEFAULT_WATCH_S,
    alpha: float = DEFAULT_ALPHA,
    issue: int | None = None,
    now_ms: float = 0.0,
) -> ProofContract:
    """An error-signature regression's contract; p0 is the signature's rate in the regressed build.

    ``any_route`` widens ``error:<route>:<exception>`` to ``error:*:<exception>``: the defect must stop on every
    route of the service, not only on the one where it was noticed.
    """
    if event.metric != "errors":
        raise ValueError(f"only error regressions have a contract, not {event.metric!r}")
    sig = parse_signature(event.signature)
    if not isinstance(sig, ErrorSignature):
        raise ValueError(f"not an error signature: {event.signature!r}")
    if any_route:
        sig = ErrorSignature(ANY_ROUTE, sig.error)
    p0 = max((e.after_rate for e in event.evidence), default=0.0) or None
    return ProofContract(
        signature=str(sig),
        fingerprint=event.fingerprint,
        must_start=must_start,
        watch_s=watch_s,
        min_requests=min_requests_for(p0, alpha),
        alpha=alpha,
        baseline_rate=p0,
        service=event.service,
        version=event.version,
        routes=[] if any_route else [event.operation],
        reports=[sig.error] if not sig.error.startswith("HTTP ") and sig.error != "error" else [],
        issue=issue,
        created_unix_ms=now_ms,
    )


# ---- graph ---------------------------------------------------------------------------------------------------

CONTRACT_UPSERT = (
    "UNWIND $rows AS r "
    "MERGE (c:Contract {signature: r.signature}) "
    "SET c.fingerprint = r.fingerprint, c.must_start = r.must_start, c.watch_s = r.watch_s, "
    "c.min_requests = r.min_requests, c.alpha = r.alpha, c.baseline_rate = r.baseline_rate, c.service = r.service, "
    "c.version = r.version, c.issue = r.issue, c.created = r.created, c.json = r.json "
    "MERGE (i:Incident {fingerprint: r.fingerprint}) ON CREATE SET i.status = 'open' "
    "MERGE (c)-[:FOR]->(i)"
)


def contract_row(c: ProofContract) -> Row:
    """Parameters of ``CONTRACT_UPSERT``: ``(:Contract)-[:FOR]->(:Incident)``."""
    return {
        "signature": c.signature,
        "fingerprint": c.fingerprint,
        "must_start": c.must_start,
        "watch_s": c.watch_s,
        "min_requests": c.min_requests,
        "alpha": c.alpha,
        "baseline_rate": c.baseline_rate,
        "service": c.service,
        "version": c.version,
        "issue": c.issue,
        "created": c.created_unix_ms,
        "json": c.model_dump_json(),  # the whole contract, so that a restarted daemon resumes its watch
    }
