"""Proof contracts: what a build must show in production before its fix counts as proven.

A contract names a *signature* that must stop and an event the fix must start emitting (``must_start``: a log
record's ``event.name``, or the name of a span), how long to watch a new build (``watch_s``, event time) and the
traffic floor ``min_requests``: with the defect's rate ``p0`` in the buggy build, ``n`` requests without one
occurrence rule it out at level ``alpha`` once ``n >= ln(alpha) / ln(1 - p0)`` (the zero-error rule).

Signatures:

* ``error:<route>:<exception type>`` (or ``error:<route>:HTTP <status>``): a request error on a route, as the
  service statistics name it; ``<route>`` is ``<METHOD> <route>``, the bare route, or ``*`` for any route of the
  service (a defect reachable from several routes). The exception matches by its qualified name or its last part.
* ``latency:<route>:><threshold>ms``: a request on a route slower than the threshold (``latency:POST /split/even:
  >237.1ms``). The threshold is a bound of the judge's latency grid (:func:`grid_bound_ms`, 40 buckets per decade),
  so that the requests over it are counted exactly from every build's latency histogram, also for the traffic seen
  before the contract was made. A latency regression's contract takes the grid bound at or above the baseline's
  p95 (the build before the regression), so at most about 5% of the baseline's requests are over it.
* ``<anomaly>:<table>:<function>+<function>``: a collision (``lost_update:orders:shop.handlers.capture_payment+
  shop.jobs.expire_cart``), the functions of the culprit and the victim, sorted and deduplicated.
* ``finding:<type>:<fingerprint>``: a finding of any other registered type (``finding:n_plus_one:3f2a...``), as its
  :meth:`~processors.model.finding.Finding.rules` name it. The judge counts each occurrence on the build it was seen
  on (``about().service`` / ``about().version``, at ``seen_unix_ms()``) exactly as it counts collisions, over the
  requests of the rules' routes (every request of the service when it names none). A rules signature the judge does
  not know (a detector's bare ``<type>:<fingerprint>``) is read as this form (:func:`finding_signature`); one of the
  forms above is judged as that form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from processors.model.contract import ANY_ROUTE, DEFAULT_ALPHA, DEFAULT_P0, DEFAULT_WATCH_S, ProofContract
from processors.model.finding import ContractRules, Finding
from processors.model.outputs import AccessInfo, IncidentEvent
from processors.model.regression import Evidence, RegressionEvent
from processors.model.units import zero_error_floor

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


# ---- the latency grid: bucket k holds durations in (10^((k-1)/40), 10^(k/40)] ms ------------------------------

GRID_STEPS = 40  # buckets per decade: neighbouring bounds 5.9% apart
GRID_MIN = -4 * GRID_STEPS  # 0.1 µs and faster share the lowest bucket
GRID_MAX = 8 * GRID_STEPS  # 10^5 s and slower share the highest bucket
NOMINAL_SHARE = 0.05  # the share of a baseline over its own p95


def latency_bucket(duration_ns: int) -> int:
    """The grid bucket of one duration."""
    if duration_ns <= 0:
        return GRID_MIN
    k = math.ceil(GRID_STEPS * math.log10(duration_ns / 1e6) - 1e-9)
    # Comparisons, not ``min``/``max`` calls: the proof judge buckets every request it counts.
    return GRID_MIN if k < GRID_MIN else GRID_MAX if k > GRID_MAX else k


def grid_bound_ms(k: int) -> float:
    """The upper bound of bucket ``k``, in ms, rounded as signatures write it."""
    return float(f"{10.0 ** (k / GRID_STEPS):.6g}")


def grid_threshold(ms: float) -> int:
    """The bucket whose upper bound is the smallest grid bound at or above ``ms`` (a bound written with six
    significant digits, as signatures write them, is its own bucket's)."""
    if ms <= 0:
        return GRID_MIN
    x = GRID_STEPS * math.log10(ms)
    k = round(x) if abs(x - round(x)) < 1e-4 else math.ceil(x)
    return min(max(k, GRID_MIN), GRID_MAX)


@dataclass(frozen=True, slots=True)
class LatencySignature:
    route: str  # "<METHOD> <route>" or "<route>"
    bucket: int  # requests in buckets above it are slow

    @property
    def threshold_ms(self) -> float:
        return grid_bound_ms(self.bucket)

    def matches_route(self, label: str, operation: str) -> bool:
        return self.route in (label, operation)

    def __str__(self) -> str:
        return f"latency:{self.route}:>{self.threshold_ms:g}ms"


@dataclass(frozen=True, slots=True)
class CollisionSignature:
    anomaly: str
    table: str
    functions: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.anomaly}:{self.table}:{'+'.join(self.functions)}"


@dataclass(frozen=True, slots=True)
class FindingSignature:
    """A finding's: counted like a collision, per build, under this exact text."""

    type: str
    fingerprint: str

    def __str__(self) -> str:
        return f"{FINDING}{self.type}:{self.fingerprint}"


FINDING = "finding:"
Signature = ErrorSignature | LatencySignature | CollisionSignature | FindingSignature
OCCURRENCES = (CollisionSignature, FindingSignature)  # the forms counted from published events, not from requests


def parse_signature(signature: str) -> Signature:
    """An ``error:...``, ``latency:...``, ``finding:...`` or a collision signature; ValueError for anything else."""
    if signature.startswith(FINDING):
        kind, sep, fingerprint = signature.removeprefix(FINDING).partition(":")
        if not sep or not kind or not fingerprint:
            raise ValueError(f"finding signature must be finding:<type>:<fingerprint>, got {signature!r}")
        return FindingSignature(kind, fingerprint)
    if signature.startswith("latency:"):
        route, sep, bound = signature.removeprefix("latency:").rpartition(":")
        try:
            ms = float(bound.removeprefix(">").removesuffix("ms")) if bound.startswith(">") else -1.0
        except ValueError:
            ms = -1.0
        if not sep or not route or not bound.endswith("ms") or not 0 < ms < math.inf:
            raise ValueError(f"latency signature must be latency:<route>:><ms>ms, got {signature!r}")
        return LatencySignature(route, grid_threshold(ms))
    if signature.startswith("error:"):
        route, sep, error = signature.removeprefix("error:").rpartition(":")
        if not sep or not route or not error:
            raise ValueError(f"error signature must be error:<route>:<exception>, got {signature!r}")
        return ErrorSignature(route, error)
    parts = signature.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise ValueError(
            f"signature must be error:<route>:<exception>, latency:<route>:><ms>ms, "
            f"finding:<type>:<fingerprint> or <anomaly>:<table>:<f>+<g>: {signature!r}"
        )
    anomaly, table, functions = parts
    return CollisionSignature(anomaly, table, tuple(sorted({f for f in functions.split("+") if f})))


def _who(a: AccessInfo) -> str:
    return a.function or a.service


def collision_signature(incident: IncidentEvent) -> str:
    """``<anomaly>:<table>:<culprit function>+<victim function>`` (sorted, deduplicated)."""
    functions = sorted({_who(incident.culprit), _who(incident.victim)})
    return str(CollisionSignature(incident.anomaly, incident.table, tuple(functions)))


def finding_signature(finding: Finding, rules: ContractRules) -> str:
    """The signature the judge counts ``finding`` under: its rules' own when it is one of the known forms (written
    canonically), else ``finding:<type>:<rest>`` (``<rest>``: the rules' signature without a leading ``<type>:``)."""
    try:
        return str(parse_signature(rules.signature))
    except ValueError:
        kind = finding.finding_type()
        return str(FindingSignature(kind, rules.signature.removeprefix(kind + ":") or finding.fingerprint))


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
    automatic: bool = False,
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
        automatic=automatic,
    )


def contract_from_finding(
    finding: Finding,
    rules: ContractRules,
    *,
    watch_s: float = DEFAULT_WATCH_S,
    alpha: float = DEFAULT_ALPHA,
    issue: int | None = None,
    automatic: bool = False,
) -> ProofContract:
    """A finding's contract from its rules: the build it was seen on is the reference (every build first seen after
    it is judged), the floor the zero-error rule's for ``rules.baseline_rate`` (the default floor when unknown)."""
    about = finding.about()
    return ProofContract(
        signature=finding_signature(finding, rules),
        fingerprint=finding.fingerprint,
        must_start=rules.must_start,
        watch_s=watch_s,
        min_requests=min_requests_for(rules.baseline_rate, alpha),
        alpha=alpha,
        baseline_rate=rules.baseline_rate,
        service=rules.service or about.service,
        version=about.version,
        routes=sorted(set(rules.routes)),
        issue=issue,
        created_unix_ms=finding.detected_at_unix_ms,
        automatic=automatic,
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
    automatic: bool = False,
) -> ProofContract:
    """A regression's contract: the error signature (p0 its rate in the regressed build), or the latency signature
    over the baseline's p95 (see :func:`latency_contract`).

    ``any_route`` widens ``error:<route>:<exception>`` to ``error:*:<exception>``: the defect must stop on every
    route of the service, not only on the one where it was noticed.
    """
    if event.metric == "latency":
        return latency_contract(event, must_start, watch_s=watch_s, alpha=alpha, issue=issue, now_ms=now_ms,
                                automatic=automatic)  # fmt: skip
    if event.metric != "errors":
        raise ValueError(f"no contract for a {event.metric!r} regression")
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
        automatic=automatic,
    )


def latency_evidence(event: RegressionEvent) -> Evidence:
    """The latency test the threshold comes from: against the previous version when one flagged it (its p95 is the
    build's before the regression), else the most significant one. ValueError without latency evidence."""
    tests = [e for e in event.evidence if e.metric == "latency" and e.before_p95_ms > 0]
    if not tests:
        raise ValueError(f"latency regression {event.fingerprint} has no latency evidence with a p95")
    return min(tests, key=lambda e: (e.comparison != "version", e.p_adjusted))


def latency_contract(
    event: RegressionEvent,
    must_start: str,
    *,
    watch_s: float = DEFAULT_WATCH_S,
    alpha: float = DEFAULT_ALPHA,
    issue: int | None = None,
    now_ms: float = 0.0,
    automatic: bool = False,
) -> ProofContract:
    """A latency regression's contract: requests on its route slower than the grid bound at or above the baseline's
    p95 must become rarer, significantly, than on the regressed build (the judge's latency rule).

    ``baseline_rate`` is the nominal share over the threshold before the regression (5%, a baseline's share over its
    own p95); ``min_requests`` the zero-error floor of that share (the judge plans its first look from the counts).
    """
    if event.metric != "latency" or not event.signature.startswith("latency:"):
        raise ValueError(f"not a latency regression: {event.signature!r}")
    ev = latency_evidence(event)
    sig = LatencySignature(event.signature.removeprefix("latency:"), grid_threshold(ev.before_p95_ms))
    return ProofContract(
        signature=str(sig),
        fingerprint=event.fingerprint,
        must_start=must_start,
        watch_s=watch_s,
        min_requests=min_requests_for(NOMINAL_SHARE, alpha),
        alpha=alpha,
        baseline_rate=NOMINAL_SHARE,
        service=event.service,
        version=event.version,
        routes=[event.operation],
        issue=issue,
        created_unix_ms=now_ms,
        automatic=automatic,
        baseline_version=ev.before_version if ev.comparison == "version" else "",
    )
