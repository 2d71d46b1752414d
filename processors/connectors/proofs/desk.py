"""The proof desk: every incident gets a proof contract, and every new build is judged against the contracts.

A connector inside stage 1: it consumes the stage's closed traces and logs (each build's own telemetry) and the
events of two output topics, ``incidents`` (the incidents stage 2 publishes, and regressions) and ``contracts``
(contracts added by the CLI or other tools, and those stored on the graph when the daemon starts). Every incident
gets a proof contract (no must-start event unless one is added by CLI; the traffic floor from the defect's rate on
its build by the zero-error rule), recorded on the graph so that a restarted daemon keeps watching; a contract
given by a person wins over the automatic one. Verdicts come out as events. Deploy marks (``trace-repro deploy
mark``) arrive on ``contracts`` too and are kept as keyed state holding their record, so a restart replays them
(:mod:`~processors.connectors.proofs.marks`); at ``max_marks`` the oldest goes (counted).

Every other finding (a :class:`~processors.model.finding.Finding` whose ``rules()`` are not None, whatever its type)
is counted per build under its rules' signature (``finding:<type>:<fingerprint>``, see
:mod:`~processors.connectors.proofs.contracts`) exactly as collisions are, and gets one automatic contract per
fingerprint (:func:`~processors.connectors.proofs.contracts.contract_from_finding`: the rules' routes, must-start
event and floor); the desk reads findings through that interface only, never by their class.

Regressions are incidents of their own kind: each regression fingerprint gets one automatic contract
(:func:`~processors.connectors.proofs.contracts.contract_from_regression`: the error signature on its route, or
the requests on its route slower than the baseline's p95, judged on each later build's latency histogram). Later
windows of the same build change nothing (deduplicated by fingerprint); a regression of the same fingerprint on a
build first seen after the contracted one (a recurrence) moves the contract to that build, so the builds after it
are judged against it.

The judge sees the traffic of this stage-1 instance: for verdicts over all of a service's traffic, run a single
ingest instance or partition the spans topic by service (see docs/architecture.md, "Scaling out").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from processors.api.component import Context, Emit, Factory, GraphQueries, Processor
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.connectors.proofs.config import ProofConfig
from processors.connectors.proofs.contracts import (
    OCCURRENCES,
    contract_from_finding,
    contract_from_incident,
    contract_from_regression,
    parse_signature,
)
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.marks import DeployMark
from processors.connectors.proofs.tallies import Contribution, PartKey, Tally
from processors.model.base import Published
from processors.model.contract import ProofContract, promised_event
from processors.model.events import Access, LogRecord
from processors.model.finding import Finding
from processors.model.graph import Row
from processors.model.incident import IncidentEvent
from processors.model.regression import RegressionEvent
from processors.model.trace import ClosedTrace
from processors.model.units import s_to_ns
from processors.model.verdict import VerdictEvent
from processors.state.keyed import KeyedState
from processors.state.lru import CountedLRU

SYNC_EVERY_NS = 1_000_000_000


class ProofDesk(Processor):
    """Contracts and verdicts; see the module docstring."""

    name = "proof"

    def __init__(self, config: ProofConfig, *, telemetry: Telemetry | None = None, events: StateEvents = NO_EVENTS,
                 graph: GraphQueries | None = None, clock: Callable[[], int] = time.time_ns) -> None:  # fmt: skip
        self.config = config
        self.telemetry = (telemetry or Telemetry("proof")).declare(
            "regression_without_contract", "finding_without_contract"
        )
        self.judge = ProofJudge(settle_ns=s_to_ns(config.settle_s), slice_ns=s_to_ns(config.slice_s),
                                max_builds=config.max_builds, max_keys=config.max_keys,
                                max_fingerprints=config.max_fingerprints, telemetry=self.telemetry,
                                events=events)  # fmt: skip
        self.graph = graph
        self.clock = clock
        self._synced_ms = 0.0  # contributions loaded up to this wall time
        self._next_sync_ns = 0
        self._must_sync = True
        bound = config.max_fingerprints
        self._occurrences: CountedLRU[str, int] = CountedLRU(bound, self.telemetry, "max_fingerprints")
        self._cli_contracts: CountedLRU[str, None] = CountedLRU(bound, self.telemetry, "max_contracts")
        self._automatic: CountedLRU[str, str] = CountedLRU(bound, self.telemetry, "max_automatic")  # fp -> version
        self._new_contracts: list[ProofContract] = []
        self._marks: KeyedState[DeployMark, None] = KeyedState(
            "deploy_marks", bound=config.max_marks, new=lambda _m: None, telemetry=self.telemetry, events=events,
            on_evict=lambda mark, _: self.judge.on_mark(mark, keep=False), reason="max_marks",
        )  # fmt: skip

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        self.judge.on_trace(trace)

    def on_log(self, record: LogRecord, part: str) -> None:
        self.judge.on_log(record, part)

    def on_revoke(self, part: str) -> None:
        self.judge.revoke(part)

    def on_assign(self, part: str) -> None:
        self._must_sync = True  # load what the partition's previous owner counted before counting more

    async def sync(self) -> None:
        """Load the contributions written since the last load (every second; at once after an assignment)."""
        now = self.clock()
        if self.graph is None or not (self._must_sync or now >= self._next_sync_ns):
            return
        since = self._synced_ms - 60_000  # a minute of overlap: other writers' clocks may lag (loads are idempotent)
        rows = await self.graph.tallies_since(since)
        self.judge.load([((r["service"], r["version"], r["part"]), contribution_of(r)) for r in rows])
        self._synced_ms = max([self._synced_ms, *(float(r["updated"]) for r in rows)])
        self._next_sync_ns, self._must_sync = now + SYNC_EVERY_NS, False
        self.telemetry.count("contributions_loaded", len(rows))

    def on_event(self, event: Published, part: str) -> None:
        """Incidents are counted per build and get their contract, regressions get theirs, every other finding with
        contract rules is counted and gets one; contracts from people (and those stored on the graph) start a watch."""
        if isinstance(event, IncidentEvent):
            self.judge.on_incident(event, part)
            contract = self._contract_for(event)
        elif isinstance(event, RegressionEvent):
            contract = self._contract_for_regression(event)
        elif isinstance(event, DeployMark):
            self._marks.retain(event)  # its record stays uncommitted while the mark is kept: a restart replays it
            self.judge.on_mark(event)
            self.telemetry.count("deploy_marks")
            return
        elif isinstance(event, ProofContract):
            contract = event
            if contract.automatic:
                self._automatic.put(contract.fingerprint, contract.version)  # stored: a restart keeps watching
            else:
                self._cli_contracts.add(contract.fingerprint)
        elif isinstance(event, Finding):
            contract = self._contract_for_finding(event, part)
        else:
            return
        if contract is None:
            return
        self.judge.on_contract(contract)
        self._new_contracts.append(contract)
        self.telemetry.count("contracts")

    def _contract_for(self, incident: IncidentEvent) -> ProofContract | None:
        """The incident's automatic contract, its floor from the defect's rate so far on the buggy build; the fix must
        start the event its issue's contract section promises (the "Proves #N" repair emits it)."""
        if incident.fingerprint in self._cli_contracts:
            return None  # a contract given by a person wins
        n = (self._occurrences.get(incident.fingerprint) or 0) + 1
        self._occurrences.put(incident.fingerprint, n)
        c = incident.culprit
        routes = {incident.culprit.route, incident.victim.route} - {""}
        requests = self.judge.requests_on(c.service, incident.victim.version or c.version, routes)
        return contract_from_incident(incident, promised_event(incident.fingerprint), occurrences=n,
                                      requests=max(requests, n),
                                      watch_s=self.config.watch_s, now_ms=incident.detected_at_unix_ms,
                                      automatic=True)  # fmt: skip

    def _contract_for_regression(self, event: RegressionEvent) -> ProofContract | None:
        """The regression's automatic contract: once per fingerprint, again only for a build first seen later than
        the contracted one (a recurrence); None when a person's contract or an earlier one stands."""
        fp = event.fingerprint
        if fp in self._cli_contracts:
            return None
        contracted = self._automatic.get(fp)
        if contracted is not None:
            if contracted == event.version or not self.judge.newer(event.service, event.version, contracted):
                self.telemetry.count("regressions_deduplicated")
                return None
            self.telemetry.count("regressions_recurred")
        try:
            contract = contract_from_regression(event, "", watch_s=self.config.watch_s,
                                                now_ms=event.detected_at_unix_ms, automatic=True)  # fmt: skip
        except ValueError:
            self.telemetry.drop("regression_without_contract")  # no signature a build can be judged on
            return None
        self._automatic.put(fp, event.version)
        return contract

    def _contract_for_finding(self, finding: Finding, part: str) -> ProofContract | None:
        """Count a finding with contract rules under its signature on its build; its automatic contract once per
        fingerprint (the build first seen with it is the reference: a recurrence on a later build is that build's
        NOT_FIXED, not a new contract); None without rules, or when a person's contract or an earlier one stands."""
        rules = finding.rules()
        if rules is None:
            return None
        try:
            contract = contract_from_finding(finding, rules, watch_s=self.config.watch_s, automatic=True)
            counted = isinstance(parse_signature(contract.signature), OCCURRENCES)
        except ValueError:  # (pydantic's ValidationError is one) no signature or fingerprint a build is judged on
            self.telemetry.drop("finding_without_contract")
            return None
        if counted:
            self.judge.on_finding(finding, contract.signature, contract.routes, part)
        fp = finding.fingerprint
        if fp in self._cli_contracts:
            return None
        if fp in self._automatic:
            self.telemetry.count("findings_deduplicated")
            return None
        self._automatic.put(fp, contract.version)
        return contract

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        out.graph.records.extend(self._new_contracts)
        self._new_contracts = []
        out.events.extend(self.judge.close_until(watermark_ns, out.quarantined))
        updated = self.clock() / 1e6
        out.graph.tallies.extend(contribution_row(key, c, updated) for key, c in self.judge.contributions())


def contribution_row(key: PartKey, c: Contribution, updated_ms: float) -> Row:
    service, version, part = key
    return {"key": "|".join(key), "service": service, "version": version, "part": part, "revision": c.revision,
            "first_ns": c.first_ns, "last_ns": c.last_ns, "settled_until": c.settled_until_ns,
            "json": c.tally.to_json(), "updated": updated_ms}  # fmt: skip


def contribution_of(row: dict[str, Any]) -> Contribution:
    return Contribution(Tally.from_json(row["json"]), int(row["settled_until"]), int(row["first_ns"]),
                        int(row["last_ns"]), str(row["revision"] or ""))  # fmt: skip


def create(config: ProofConfig, ctx: Context) -> ProofDesk:
    return ProofDesk(config, telemetry=ctx.telemetry("proof"), events=ctx.state_events, graph=ctx.graph,
                     clock=ctx.clock)  # fmt: skip


FACTORY: Factory[ProofConfig, ProofDesk] = Factory(
    kind="connector", name="proof", config=ProofConfig, create=create, stage="ingest",
    topics=("incidents", "contracts"), events=(VerdictEvent, DeployMark),  # marks: published by the CLI
)  # fmt: skip
