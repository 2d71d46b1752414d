"""The proof judge: did a deployed build fix the defect its proof contract names, judged on its own telemetry.

Everything is keyed by the telemetry's own ``(service, service.version)``: a request by its span's resource, a
log record by its resource, a collision by the versions of its culprit and victim. Old-version traffic that
arrives after a deploy (a draining pod, a late exporter) counts for the old build, never against the new one.
A collision between two builds (culprit on one version, victim on another) counts for neither: it is reported.

Input arrives in event time; the judge keeps it in slices and only decides on slices older than the watermark
minus ``settle`` (collisions are found downstream, later than the traces they are about). Every build of a
contract's service first seen after the build the defect was seen on is judged, against:

* the build first seen just before it (``WORSE``: its total error rate is higher, one-sided conditional binomial
  test at ``alpha / 2`` at each of two looks: when it reaches ``min_requests``, and when the watch ends);
* the latest earlier build where the signature occurred (the receipt's *before*).

Outcomes, each at most once per (contract, build): ``NOT_FIXED`` as soon as the signature occurs on the build
(with where: routes and functions, or the colliding functions); ``FIXED`` once the build served ``min_requests``
matching requests without it and the must-start event was seen; ``WORSE`` (rollback) when the error-rate test
says so, whatever the fix does; ``INSUFFICIENT`` when the watch (``watch_s`` of event time from the build's first
request) ends without another verdict, with the requests still needed. A ``FIXED`` can be followed by a
``NOT_FIXED`` (a late collision) or a ``WORSE``; nothing follows a ``WORSE``.

The must-start event is a log record's ``event.name`` or, for spans, a span named after it. State is bounded:
``max_builds`` builds per service, ``max_keys`` routes, error kinds and event names per build (overflow counted).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from processors.contracts import (
    CollisionSignature,
    ErrorSignature,
    ProofContract,
    collision_signature,
    parse_signature,
)
from processors.graph_rows import Row
from processors.stat_tests import conditional_binomial, rate_interval
from processors.stats import error_part, requests_of, site
from processors.traces import ClosedTrace
from streamer.events import LogRecord
from streamer.schemas import IncidentEvent, Receipt, VerdictEvent

NS = 1_000_000_000
K = TypeVar("K", bound=Hashable)
FIXED, NOT_FIXED, WORSE, INSUFFICIENT = "FIXED", "NOT_FIXED", "WORSE", "INSUFFICIENT"
SIGNATURE_TEST = ("one-sided conditional binomial (exact): signature rate after < before; "
                  "interval: exact 95% CI of the signature's rate after")  # fmt: skip
WORSE_TEST = ("one-sided conditional binomial (exact): total error rate after > before, at alpha/2 per look; "
              "interval: exact 95% CI of the error rate after")  # fmt: skip


@dataclass(slots=True)
class _Tally:
    """Counts of one build over some event-time span."""

    requests: int = 0
    errors: int = 0
    routes: dict[tuple[str, str], int] = field(default_factory=dict)  # (label, operation) -> requests
    failures: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (label, operation, error) -> count
    sites: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # event name -> records
    collisions: dict[str, int] = field(default_factory=dict)  # signature -> occurrences all on this build
    collision_sites: dict[str, dict[str, int]] = field(default_factory=dict)
    mixed: dict[str, int] = field(default_factory=dict)  # signature -> occurrences with another build

    def merge(self, other: _Tally) -> None:
        self.requests += other.requests
        self.errors += other.errors
        _add(self.routes, other.routes)
        _add(self.failures, other.failures)
        _add(self.events, other.events)
        _add(self.collisions, other.collisions)
        _add(self.mixed, other.mixed)
        for k, places in other.sites.items():
            _add(self.sites.setdefault(k, {}), places)
        for s, places in other.collision_sites.items():
            _add(self.collision_sites.setdefault(s, {}), places)


def _add(into: dict[K, int], other: dict[K, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


@dataclass(slots=True)
class _Build:
    service: str
    version: str
    first_ns: int
    last_ns: int
    revision: str = ""
    settled: _Tally = field(default_factory=_Tally)
    pending: dict[int, _Tally] = field(default_factory=dict)  # slice start -> counts not yet settled
    settled_until_ns: int = 0


@dataclass(slots=True)
class _Watch:
    emitted: list[str] = field(default_factory=list)
    looked: bool = False  # the look at min_requests happened
    closed: bool = False


@dataclass(slots=True)
class _Bound:
    contract: ProofContract
    signature: ErrorSignature | CollisionSignature
    service: str
    version: str


@dataclass(frozen=True, slots=True)
class _Matched:
    count: int
    requests: int
    sites: list[str]


class ProofJudge:
    """Pure event-time processor: feed it traces, logs, incidents and contracts; ``close_until`` gives verdicts."""

    def __init__(
        self,
        *,
        settle_ns: int = 0,
        slice_ns: int = NS,
        max_builds: int = 16,
        max_keys: int = 1024,
        max_sites: int = 16,
    ) -> None:
        self.settle_ns = settle_ns
        self.slice_ns = slice_ns
        self.max_builds = max_builds
        self.max_keys = max_keys
        self.max_sites = max_sites
        self._builds: dict[str, dict[str, _Build]] = {}  # service -> version -> build
        self._contracts: dict[str, _Bound] = {}  # by incident fingerprint
        self._watches: dict[tuple[str, str, str], _Watch] = {}  # (fingerprint, service, version)
        self._fingerprint_signatures: dict[str, set[str]] = {}  # incident fingerprint -> collision signatures
        self._collision_routes: dict[str, set[str]] = {}  # collision signature -> routes of its requests
        self._must_start: set[str] = set()  # span names that count as must-start events
        self._horizon = 0
        self.counters = {"requests": 0, "logs": 0, "incidents": 0, "mixed_incidents": 0, "overflow": 0,
                         "builds_dropped": 0, "verdicts": 0}  # fmt: skip

    # ---- input ---------------------------------------------------------------------------------------------

    def on_contract(self, contract: ProofContract) -> None:
        """Start (or replace) the watch of one incident's contract."""
        old = self._contracts.get(contract.fingerprint)
        service = contract.service or (old.service if old else "")
        version = contract.version or (old.version if old else "")
        self._contracts[contract.fingerprint] = _Bound(contract, parse_signature(contract.signature), service, version)
        if contract.must_start:
            self._must_start.add(contract.must_start)

    def on_trace(self, trace: ClosedTrace) -> None:
        """Count the trace's requests (and spans named after a must-start event) under their own builds."""
        for req in requests_of(trace):
            self.counters["requests"] += 1
            build = self._build(req.service, req.version, req.start_ns, req.revision)
            t = self._tally(build, req.start_ns)
            t.requests += 1
            self._bump(t.routes, (req.label, req.operation))
            if req.error:
                t.errors += 1
                key = (req.label, req.operation, error_part(req.exception, req.http_status))
                if self._bump(t.failures, key):
                    self._site(t.sites.setdefault(key, {}), site(req.label, req.function))
        for span in trace.spans:
            if span.name in self._must_start:
                r = span.resource
                build = self._build(r.service, r.version, span.start_ns, r.revision)
                self._bump(self._tally(build, span.start_ns).events, span.name)

    def on_log(self, record: LogRecord) -> None:
        """Count a log record's event name under its own build."""
        if not record.event_name:
            return
        self.counters["logs"] += 1
        r = record.resource
        build = self._build(r.service, r.version, record.time_ns, r.revision)
        self._bump(self._tally(build, record.time_ns).events, record.event_name)

    def on_incident(self, incident: IncidentEvent) -> None:
        """Count a collision on the build both its parties ran, or as mixed on each of theirs."""
        self.counters["incidents"] += 1
        sig = collision_signature(incident)
        fps = self._fingerprint_signatures.setdefault(incident.fingerprint, set())
        if len(fps) < self.max_sites:
            fps.add(sig)
        routes = self._collision_routes.setdefault(sig, set())
        for a in (incident.culprit, incident.victim):
            if a.route and len(routes) < self.max_sites:
                routes.add(a.route)
        at = int(incident.culprit.start_unix_ms * 1e6)
        parties = {(a.service, a.version) for a in (incident.culprit, incident.victim)}
        c, v = incident.culprit, incident.victim
        where = f"{c.function or c.service} ({c.route}) vs {v.function or v.service} ({v.route}) on {incident.table}"
        if len(parties) == 1:
            build = self._build(c.service, c.version, at, "")
            t = self._tally(build, at)
            if self._bump(t.collisions, sig):
                self._site(t.collision_sites.setdefault(sig, {}), where)
            return
        self.counters["mixed_incidents"] += 1
        for service, version in sorted(parties):
            self._bump(self._tally(self._build(service, version, at, ""), at).mixed, sig)

    def requests_on(self, service: str, version: str, routes: Iterable[str]) -> int:
        """Requests counted so far (settled or not) for ``routes`` of one build: the traffic behind a rate."""
        build = self._builds.get(service, {}).get(version)
        if build is None:
            return 0
        wanted = set(routes)
        return sum(n for t in (build.settled, *build.pending.values()) for (label, op), n in t.routes.items()
                   if label in wanted or op in wanted)  # fmt: skip

    # ---- state ---------------------------------------------------------------------------------------------

    def _bump(self, counts: dict[K, int], key: K) -> bool:
        """Count one under ``key``; False (and counted as overflow) when the map is full."""
        if key not in counts and len(counts) >= self.max_keys:
            self.counters["overflow"] += 1
            return False
        counts[key] = counts.get(key, 0) + 1
        return True

    def _site(self, places: dict[str, int], where: str) -> None:
        if where in places or len(places) < self.max_sites:
            places[where] = places.get(where, 0) + 1

    def _build(self, service: str, version: str, at_ns: int, revision: str) -> _Build:
        builds = self._builds.setdefault(service, {})
        build = builds.get(version)
        if build is None:
            build = builds[version] = _Build(service, version, at_ns, at_ns, revision,
                                             settled_until_ns=self._horizon)  # fmt: skip
            if len(builds) > self.max_builds:
                oldest = min(builds.values(), key=lambda b: b.first_ns)
                del builds[oldest.version]
                self.counters["builds_dropped"] += 1
                for key in [k for k in self._watches if k[1] == service and k[2] == oldest.version]:
                    del self._watches[key]
        build.first_ns = min(build.first_ns, at_ns)
        build.last_ns = max(build.last_ns, at_ns)
        build.revision = build.revision or revision
        return build

    def _tally(self, build: _Build, at_ns: int) -> _Tally:
        start = at_ns - at_ns % self.slice_ns
        if start + self.slice_ns <= build.settled_until_ns:
            return build.settled  # late for its slice: settled already, counted now
        t = build.pending.get(start)
        if t is None:
            t = build.pending[start] = _Tally()
        return t

    def _settle(self, horizon: int) -> None:
        self._horizon = max(self._horizon, horizon)
        for builds in self._builds.values():
            for build in builds.values():
                for start in sorted(s for s in build.pending if s + self.slice_ns <= self._horizon):
                    build.settled.merge(build.pending.pop(start))
                build.settled_until_ns = max(build.settled_until_ns, self._horizon)

    # ---- matching ------------------------------------------------------------------------------------------

    def _matched(self, bound: _Bound, t: _Tally) -> _Matched:
        sig = bound.signature
        if isinstance(sig, ErrorSignature):
            requests = sum(n for (label, op), n in t.routes.items() if sig.matches_route(label, op))
            hits = {k: n for k, n in t.failures.items() if sig.matches_route(k[0], k[1]) and sig.matches_error(k[2])}
            places: dict[str, int] = {}
            for k in hits:
                for where, n in t.sites.get(k, {}).items():
                    places[where] = places.get(where, 0) + n
            return _Matched(sum(hits.values()), requests, _ranked(places))
        sigs = self._collision_signatures(bound)
        routes = set(bound.contract.routes)
        for s in sigs:
            routes |= self._collision_routes.get(s, set())
        requests = sum(n for (label, op), n in t.routes.items() if label in routes or op in routes)
        places = {}
        for s in sigs:
            for where, n in t.collision_sites.get(s, {}).items():
                places[where] = places.get(where, 0) + n
        count = sum(t.collisions.get(s, 0) for s in sigs)
        return _Matched(count, requests if routes else t.requests, _ranked(places))

    def _collision_signatures(self, bound: _Bound) -> set[str]:
        return {str(bound.signature)} | self._fingerprint_signatures.get(bound.contract.fingerprint, set())

    def _bind(self, bound: _Bound) -> None:
        """A contract without service or version takes those of the earliest build its signature occurred on."""
        if bound.service and bound.version:
            return
        found: list[tuple[int, str, str]] = []
        for service, builds in self._builds.items():
            if bound.service and service != bound.service:
                continue
            for build in builds.values():
                if self._matched(bound, build.settled).count:
                    found.append((build.first_ns, service, build.version))
        if found:
            _, service, version = min(found)
            bound.service = bound.service or service
            bound.version = bound.version or version

    # ---- verdicts ------------------------------------------------------------------------------------------

    def close_until(self, watermark_ns: int) -> list[VerdictEvent]:
        """Settle what is older than ``watermark - settle`` and judge every watched build on it."""
        self._settle(watermark_ns - self.settle_ns)
        out: list[VerdictEvent] = []
        for fingerprint in sorted(self._contracts):
            bound = self._contracts[fingerprint]
            self._bind(bound)
            if not bound.service:
                continue
            builds = sorted(self._builds.get(bound.service, {}).values(), key=lambda b: (b.first_ns, b.version))
            reference = next((b for b in builds if b.version == bound.version), None)
            for i, build in enumerate(builds):
                if build.version == bound.version or (reference is not None and build.first_ns <= reference.first_ns):
                    continue
                watch = self._watches.setdefault((fingerprint, bound.service, build.version), _Watch())
                if not watch.closed:
                    out.extend(self._judge(bound, build, builds[:i], watch))
        self.counters["verdicts"] += len(out)
        return out

    def _judge(self, bound: _Bound, build: _Build, earlier: list[_Build], watch: _Watch) -> list[VerdictEvent]:
        c = bound.contract
        t = build.settled
        now = self._matched(bound, t)
        reached = now.requests >= c.min_requests
        over = self._horizon >= build.first_ns + int(c.watch_s * NS)
        must = t.events.get(c.must_start, 0)
        out: list[VerdictEvent] = []
        if WORSE in watch.emitted:
            watch.closed = watch.closed or over
            return out
        look = over or (reached and not watch.looked)
        watch.looked = watch.looked or reached
        previous = earlier[-1] if earlier else None
        if look and previous is not None and previous.settled.requests and t.requests:
            p = previous.settled
            test = conditional_binomial(p.errors, p.requests, t.errors, t.requests, "greater")
            if test.p_value <= c.alpha / 2:
                gone = "the contract's signature is gone" if now.count == 0 else f"{str(bound.signature)!r} remains"
                reason = (f"{build.version} fails {t.errors}/{t.requests} requests vs {p.errors}/{p.requests} on "
                          f"{previous.version}: worse overall (p={test.p_value:.3g} <= {c.alpha / 2:g}), roll back; "
                          f"{gone}; new errors at {', '.join(_new_errors(t, p)) or 'n/a'}")  # fmt: skip
                receipt = self._receipt(build, now, must, c, p.errors, p.requests, t.errors, t.requests,
                                        WORSE_TEST, test.p_value)  # fmt: skip
                out.append(self._verdict(bound, build, WORSE, reason, receipt))
        if not out:
            before = next((b for b in reversed(earlier) if self._matched(bound, b.settled).count), previous)
            old = self._matched(bound, before.settled) if before is not None else _Matched(0, 0, [])
            p_value = (conditional_binomial(old.count, old.requests, now.count, now.requests, "less").p_value
                       if old.requests and now.requests else None)  # fmt: skip
            was = "no earlier build"
            if before is not None:
                was = f"before: {old.count}/{old.requests} on {before.version}"
            sig = str(bound.signature)
            outcome, reason = "", ""
            if now.count:
                outcome = NOT_FIXED
                reason = (f"{sig!r} still happens on {build.version}: {now.count} of {now.requests} requests, at "
                          f"{'; '.join(now.sites) or 'unknown site'} ({was})")  # fmt: skip
            elif reached and (must or not c.must_start):
                outcome = FIXED
                seen = f"{c.must_start!r} seen {must} time(s)" if c.must_start else "no must-start event promised"
                reason = (f"{sig!r} not seen in {now.requests} requests of {build.version} (floor {c.min_requests}); "
                          f"{seen}; {was}")  # fmt: skip
            elif over and not watch.emitted:
                outcome = INSUFFICIENT
                if reached:
                    reason = (f"{sig!r} not seen in {now.requests} requests, but {c.must_start!r} never was: "
                              "no evidence that the fix ran")  # fmt: skip
                else:
                    reason = (f"{now.requests} of {c.min_requests} requests in {c.watch_s:g}s of {build.version}: "
                              f"{c.min_requests - now.requests} more needed")  # fmt: skip
            if outcome and outcome not in watch.emitted and not (outcome == FIXED and NOT_FIXED in watch.emitted):
                receipt = self._receipt(build, now, must, c, old.count, old.requests, now.count, now.requests,
                                        SIGNATURE_TEST, p_value)  # fmt: skip
                out.append(self._verdict(bound, build, outcome, reason, receipt))
        watch.emitted.extend(v.outcome for v in out)
        watch.closed = watch.closed or over
        return out

    def _receipt(self, build: _Build, now: _Matched, must: int, c: ProofContract, before_errors: int,
                 before_requests: int, after_errors: int, after_requests: int, test: str,
                 p_value: float | None) -> Receipt:  # fmt: skip
        return Receipt(
            before_errors=before_errors,
            before_requests=before_requests,
            after_errors=after_errors,
            after_requests=after_requests,
            test=test,
            p_value=p_value,
            interval=list(rate_interval(after_errors, after_requests)) if after_requests else None,
            must_start_seen=must,
            still_happens_at=now.sites,
            requests_needed=max(0, c.min_requests - now.requests),
            window_start_unix_ms=build.first_ns / 1e6,
            window_end_unix_ms=min(self._horizon, build.last_ns) / 1e6,
        )

    @staticmethod
    def _verdict(bound: _Bound, build: _Build, outcome: str, reason: str, receipt: Receipt) -> VerdictEvent:
        return VerdictEvent(
            fingerprint=bound.contract.fingerprint,
            contract=bound.contract.signature,
            service=build.service,
            version=build.version,
            commit=build.revision,
            outcome=outcome,
            rollback=outcome == WORSE,
            reason=reason,
            receipt=receipt,
        )


def _ranked(places: dict[str, int]) -> list[str]:
    return [where for where, _ in sorted(places.items(), key=lambda kv: (-kv[1], kv[0]))]


def _new_errors(now: _Tally, before: _Tally) -> list[str]:
    """Error sites whose rate went up from the earlier build, most frequent first."""
    grown = {k: n for k, n in now.failures.items() if n / now.requests > before.failures.get(k, 0) / before.requests}
    places: dict[str, int] = {}
    for k, n in grown.items():
        places[f"{k[0]}: {k[2]}"] = n
    return _ranked(places)[:5]


# ---- graph ---------------------------------------------------------------------------------------------------

VERDICT_UPSERT = (
    "UNWIND $rows AS r "
    "MERGE (v:Verdict {key: r.key}) "
    "SET v.outcome = r.outcome, v.service = r.service, v.version = r.version, v.commit = r.commit, "
    "v.rollback = r.rollback, v.reason = r.reason, v.receipt = r.receipt, v.at = r.at "
    "MERGE (c:Contract {signature: r.contract}) "
    "MERGE (v)-[:JUDGES]->(c)"
)


def verdict_row(v: VerdictEvent) -> Row:
    """Parameters of ``VERDICT_UPSERT``: ``(:Verdict)-[:JUDGES]->(:Contract)``, one per outcome per build."""
    return {
        "key": f"{v.fingerprint}|{v.service}|{v.version}|{v.outcome}",
        "outcome": v.outcome,
        "service": v.service,
        "version": v.version,
        "commit": v.commit,
        "rollback": v.rollback,
        "reason": v.reason,
        "receipt": json.dumps(v.receipt.model_dump(), sort_keys=True),
        "at": v.receipt.window_end_unix_ms,
        "contract": v.contract,
    }


def verdicts_by_version(verdicts: Iterable[VerdictEvent]) -> dict[str, list[str]]:
    """Outcomes per version, in emission order (a reading aid for logs and tests)."""
    out: dict[str, list[str]] = {}
    for v in verdicts:
        out.setdefault(v.version, []).append(v.outcome)
    return out
