"""The proof judge: did a deployed build fix the defect its proof contract names, judged on its own telemetry.

Everything is keyed by the telemetry's own ``(service, build)``: a request by its span's resource, a log record by
its resource, a collision by the builds of its culprit and victim, any other finding by its subject's build
(``about()``), counted under its contract rules' signature as collisions are. A build is ``service.version``, else the
deploy's commit, else its image digest (chosen at decode time), else the deploy mark in force
(:mod:`~processors.connectors.proofs.marks`); each verdict's receipt says which. Old-version traffic that
arrives after a deploy (a draining pod, a late exporter) counts for the old build, never against the new one.
A collision between two builds (culprit on one version, victim on another) counts for neither: it is reported.

Input arrives in event time; the judge keeps it in slices and only decides on slices older than the watermark
minus ``settle`` (collisions are found downstream, later than the traces they are about). Every build of a
contract's service first seen after the build the defect was seen on is judged, by the rules of
:mod:`~processors.connectors.proofs.rules` (``NOT_FIXED``, ``FIXED``, ``WORSE``, ``INSUFFICIENT``; latency contracts
by those of :mod:`~processors.connectors.proofs.latency`).

Each rule returns a typed :class:`~processors.connectors.proofs.decision.Decision` (the outcome, the rule that
decided, the numbers); :mod:`~processors.connectors.proofs.render` writes its reason, apart from the deciding.

The must-start event is a log record's ``event.name`` or, for spans, a span named after it. State is bounded:
``max_builds`` builds per service, ``max_keys`` routes, error kinds and event names per build (overflow counted).

Counts are kept per input partition (a trace's ``part``, a log's or an incident's topic partition): an open slice
is keyed state that holds its input (so a crash replays it whole); a settled slice is added to the cumulative
*contribution* of its (build, partition), which the desk writes to the graph. Every instance loads the others'
contributions (``load``): a build's counts are the sum over partitions, so N ingest replicas judge on the traffic
one process would see, and a restarted daemon resumes with what it had counted (a partition it takes over starts
from the stored contribution and skips the slices it already holds).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

from processors.api.component import Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.connectors.proofs.contracts import collision_signature, latency_bucket, parse_signature
from processors.connectors.proofs.ledger import Ledger
from processors.connectors.proofs.marks import DeployMark, Marks, identify
from processors.connectors.proofs.matching import Occurrences, matched
from processors.connectors.proofs.rules import BuildRules
from processors.connectors.proofs.tallies import Bound, Build, Contribution, Matched, PartKey, Tally, Watch
from processors.model.contract import ProofContract
from processors.model.events import LogRecord
from processors.model.finding import Finding
from processors.model.outputs import IncidentEvent, VerdictEvent
from processors.model.trace import ClosedTrace
from processors.model.units import NS
from processors.pipeline.requests import error_part, requests_of, site
from processors.state.lru import CountedLRU

K = TypeVar("K", bound=Hashable)


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
        max_open_slices: int = 100_000,
        max_fingerprints: int = 100_000,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.settle_ns = settle_ns
        self.slice_ns = slice_ns
        self.max_builds = max_builds
        self.max_keys = max_keys
        self.max_sites = max_sites
        self._builds: dict[str, dict[str, Build]] = {}  # service -> version -> build
        self._contracts: dict[str, Bound] = {}  # by incident fingerprint
        self._watches: dict[tuple[str, str, str], Watch] = {}  # (fingerprint, service, version)
        self._must_start: set[str] = set()  # span names that count as must-start events
        self.marks = Marks()  # deploy marks: the builds of telemetry that names none
        self.telemetry = (telemetry or Telemetry("proof")).declare("max_keys", "max_builds", "max_sites")
        self.occurrences = Occurrences(max_sites, max_fingerprints, self.telemetry)  # of collisions and findings
        self._counted: CountedLRU[str, None] = CountedLRU(max_fingerprints, self.telemetry, "max_occurrence_ids")
        self.ledger = Ledger(slice_ns, max_open_slices, self.telemetry, events, self._build,
                             lambda service, version: self._builds.get(service, {}).get(version))  # fmt: skip
        self.rules = BuildRules(self.ledger, self.occurrences)  # the verdict rules on one build

    @property
    def counters(self) -> dict[str, int]:
        """What was counted (requests, logs, incidents, verdicts, ...); drops are in ``telemetry.dropped``."""
        return self.telemetry.events

    # ---- input ---------------------------------------------------------------------------------------------

    def on_contract(self, contract: ProofContract) -> None:
        """Start (or replace) the watch of one incident's contract."""
        old = self._contracts.get(contract.fingerprint)
        service = contract.service or (old.service if old else "")
        version = contract.version or (old.version if old else "")
        self._contracts[contract.fingerprint] = Bound(contract, parse_signature(contract.signature), service, version)
        if contract.must_start:
            self._must_start.add(contract.must_start)

    def on_trace(self, trace: ClosedTrace) -> None:
        """Count the trace's requests (and spans named after a must-start event) under their own builds."""
        part = trace.part
        requests = requests_of(trace)
        self.telemetry.count("requests", len(requests))
        for req in requests:
            build = self._build(req.service, req.version, req.start_ns, req.revision, req.identified_by)
            t = self.ledger.slice(build, req.start_ns, part)
            t.requests += 1
            if self._bump(t.sampled, label := req.sampling.label) and req.error:  # see proofs.sampling
                t.sampled_errors[label] = t.sampled_errors.get(label, 0) + 1
            if self._bump(t.routes, route := (req.label, req.operation)):
                buckets = t.latency.setdefault(route, {})
                bucket = latency_bucket(req.end_ns - req.start_ns)
                buckets[bucket] = buckets.get(bucket, 0) + 1
            if req.error:
                t.errors += 1
                key = (req.label, req.operation, error_part(req.exception, req.http_status))
                if self._bump(t.failures, key):
                    self._site(t.sites.setdefault(key, {}), site(req.label, req.function))
        for span in trace.spans if self._must_start else ():
            if span.name in self._must_start:
                r = span.resource
                build = self._build(r.service, r.version, span.start_ns, r.revision, r.identified_by)
                self._bump(self.ledger.slice(build, span.start_ns, part).events, span.name)

    def on_log(self, record: LogRecord, part: str = "") -> None:
        """Count a log record's event name under its own build."""
        if not record.event_name:
            return
        self.telemetry.count("logs", 1)
        r = record.resource
        build = self._build(r.service, r.version, record.time_ns, r.revision, r.identified_by)
        self._bump(self.ledger.slice(build, record.time_ns, part).events, record.event_name)

    def on_incident(self, incident: IncidentEvent, part: str = "") -> None:
        """Count a collision on the build both its parties ran, or as mixed on each of theirs."""
        if self._again(incident.event_id):
            return
        self.telemetry.count("incidents", 1)
        sig = collision_signature(incident)
        c, v = incident.culprit, incident.victim
        at = int(c.start_unix_ms * 1e6)
        parties = {(a.service, a.version) for a in (c, v)}
        where = f"{c.function or c.service} ({c.route}) vs {v.function or v.service} ({v.route}) on {incident.table}"
        if len(parties) == 1:
            self._occurred(self._build(c.service, c.version, at, ""), at, part, sig, incident.fingerprint,
                           (c.route, v.route), where, occurrence=incident.event_id)  # fmt: skip
            return
        self.occurrences.remember(sig, incident.fingerprint, (c.route, v.route))
        self.telemetry.count("mixed_incidents", 1)
        for service, version in sorted(parties):
            build = self._build(service, version, at, "")
            self._bump(self.ledger.slice(build, at, part, incident.event_id).mixed, sig)

    def on_finding(self, finding: Finding, signature: str, routes: Iterable[str] = (), part: str = "") -> None:
        """Count a finding's occurrence under ``signature`` on the build it was seen on, as collisions are, once per
        request it covers (``affected_requests``); the ``routes`` (its contract rules') are the requests it is a rate
        of."""
        event_id = finding.event_id
        if self._again(event_id):
            return
        self.telemetry.count("findings", 1)
        about = finding.about()
        at = int(finding.seen_unix_ms() * 1e6)
        where = f"{about.operation or about.service}" + (f" on {about.entity}" if about.entity else "")
        self._occurred(self._build(about.service, about.version, at, ""), at, part, signature, finding.fingerprint,
                       routes, where, finding.affected_requests(), occurrence=event_id)  # fmt: skip

    def _again(self, event_id: str) -> bool:
        """Whether this occurrence (by its event id) was counted already: the same event read twice (published
        again by a restarted detector, or replayed to this judge) counts once."""
        if not event_id:
            return False
        if event_id in self._counted:
            self.telemetry.count("occurrence_repeated")
            return True
        self._counted.put(event_id, None)
        return False

    def _occurred(self, build: Build, at: int, part: str, sig: str, fingerprint: str, routes: Iterable[str],
                  where: str, by: int = 1, *, occurrence: str = "") -> None:  # fmt: skip
        self.occurrences.remember(sig, fingerprint, routes)
        t = self.ledger.slice(build, at, part, occurrence)
        if self._bump(t.collisions, sig, by):
            self._site(t.collision_sites.setdefault(sig, {}), where)

    def requests_on(self, service: str, version: str, routes: Iterable[str]) -> int:
        """Requests counted so far (settled or not) for ``routes`` of one build: the traffic behind a rate."""
        build = self._builds.get(service, {}).get(version)
        if build is None:
            return 0
        wanted = set(routes)
        pending = self.ledger.open_slices(service, version)
        return sum(n for t in (self.ledger.settled(build), *pending) for (label, op), n in t.routes.items()
                   if label in wanted or op in wanted)  # fmt: skip

    def newer(self, service: str, version: str, than: str) -> bool:
        """Whether build ``version`` of ``service`` was first seen after build ``than`` (False if either is unknown)."""
        builds = self._builds.get(service, {})
        a, b = builds.get(version), builds.get(than)
        return a is not None and b is not None and (a.first_ns, a.version) > (b.first_ns, b.version)

    # ---- state ---------------------------------------------------------------------------------------------

    def _bump(self, counts: dict[K, int], key: K, by: int = 1) -> bool:
        """Count ``by`` under ``key``; False (and counted as overflow) when the map is full."""
        n = counts.get(key)  # (one lookup of a known key: a tuple's hash is not kept)
        if n is None:
            if len(counts) >= self.max_keys:
                self.telemetry.drop("max_keys")
                return False
            n = 0
        counts[key] = n + by
        return True

    def _site(self, places: dict[str, int], where: str) -> None:
        if where in places or len(places) < self.max_sites:
            places[where] = places.get(where, 0) + 1
        else:
            self.telemetry.drop("max_sites")

    def on_mark(self, mark: DeployMark, keep: bool = True) -> None:
        """Add (``keep=False``: remove) a deploy mark: unversioned telemetry counted from now on follows it."""
        (self.marks.add if keep else self.marks.remove)(mark)

    def _build(self, service: str, version: str, at_ns: int, revision: str, how: str = "") -> Build:
        if not version:  # (the telemetry's own build, the usual case, needs no deploy mark)
            version, how = identify(self.marks, service, version, how, at_ns)
        builds = self._builds.get(service)
        if builds is None:
            builds = self._builds[service] = {}
        build = builds.get(version)
        if build is None:
            build = builds[version] = Build(service, version, at_ns, at_ns, revision)
            if len(builds) > self.max_builds:
                oldest = min(builds.values(), key=lambda b: b.first_ns)
                del builds[oldest.version]
                self.telemetry.drop("max_builds")
                for key in [k for k in self._watches if k[1] == service and k[2] == oldest.version]:
                    del self._watches[key]
        # Comparisons, not ``min``/``max`` calls: this runs for every request counted.
        if at_ns < build.first_ns:
            build.first_ns = at_ns
        if at_ns > build.last_ns:
            build.last_ns = at_ns
        if not build.revision:
            build.revision = revision
        if not build.identified_by:
            build.identified_by = how
        return build

    def contributions(self) -> list[tuple[PartKey, Contribution]]:
        return self.ledger.contributions()

    def load(self, stored: list[tuple[PartKey, Contribution]]) -> None:
        self.ledger.load(stored)

    def revoke(self, part: str) -> None:
        self.ledger.revoke(part)

    # ---- matching ------------------------------------------------------------------------------------------

    def _matched(self, bound: Bound, t: Tally) -> Matched:
        return matched(bound, t, self.occurrences)

    def _bind(self, bound: Bound) -> None:
        """A contract without service or version takes those of the earliest build its signature occurred on."""
        if bound.service and bound.version:
            return
        found: list[tuple[int, str, str]] = []
        for service, builds in self._builds.items():
            if bound.service and service != bound.service:
                continue
            for build in builds.values():
                if self._matched(bound, self.ledger.settled(build)).count:
                    found.append((build.first_ns, service, build.version))
        if found:
            _, service, version = min(found)
            bound.service = bound.service or service
            bound.version = bound.version or version

    # ---- verdicts ------------------------------------------------------------------------------------------

    def close_until(self, watermark_ns: int, quarantined: list[Quarantined] | None = None) -> list[VerdictEvent]:
        """Settle what is older than ``watermark - settle`` and judge every watched build on it. A contract whose
        judging raises is left for the next watermark and reported in ``quarantined``; the others are judged."""
        self.ledger.settle(watermark_ns - self.settle_ns)
        out: list[VerdictEvent] = []
        for fingerprint in sorted(self._contracts):
            try:
                out.extend(self._judge_contract(fingerprint))
            except Exception as error:  # one contract's defect must not hold back every other verdict
                self.telemetry.drop("contract_failed")
                if quarantined is not None:
                    quarantined.append(Quarantined(f"contract of {fingerprint}", error))
        self.telemetry.count("verdicts", len(out))
        return out

    def _judge_contract(self, fingerprint: str) -> list[VerdictEvent]:
        bound, out = self._contracts[fingerprint], list[VerdictEvent]()
        self._bind(bound)
        if not bound.service:
            return out
        builds = sorted(self._builds.get(bound.service, {}).values(), key=lambda b: (b.first_ns, b.version))
        reference = next((b for b in builds if b.version == bound.version), None)
        for i, build in enumerate(builds):
            if build.version == bound.version or (reference is not None and build.first_ns <= reference.first_ns):
                continue
            watch = self._watches.setdefault((fingerprint, bound.service, build.version), Watch())
            if not watch.closed:
                out.extend(self.rules.judge(bound, build, builds[:i], watch))
        return out
