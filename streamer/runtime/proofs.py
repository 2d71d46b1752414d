"""Stage 1's proof desk: windowed service statistics, the regression detector, contracts and the proof judge.

Fed from stage 1's closed traces and logs, and through its inbox from the incidents stage 2 publishes (stage 1
consumes ``trace-repro.incidents`` too) and the contracts on ``trace-repro.contracts``. Every incident gets a proof
contract (no must-start event unless one is added by CLI; the traffic floor from the defect's rate on its build by
the zero-error rule), stored on the graph so that it survives restarts. Verdicts and regressions come out as events
and graph rows.

The judge sees the traffic of this stage-1 instance: for verdicts over all of a service's traffic, run a single
ingest instance or partition the spans topic by service (see README, "Scaling out").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

from processors.contracts import CONTRACT_UPSERT, ProofContract, contract_from_incident, contract_row
from processors.judge import VERDICT_UPSERT, ProofJudge, verdict_row
from processors.regressions import REGRESSION_UPSERT, DetectorSettings, RegressionDetector, regression_row
from processors.stats import STATS_STATEMENT, ServiceStats, stats_rows
from processors.traces import ClosedTrace
from streamer.config import Settings
from streamer.events import LogRecord
from streamer.runtime.records import Outbound, StageOutput
from streamer.schemas import IncidentEvent

NS = 1_000_000_000


class ProofDesk:
    def __init__(self, settings: Settings) -> None:
        w, r, p = settings.windows, settings.regressions, settings.proof
        self.settings = settings
        self.stats = ServiceStats(int(w.window_s * NS), int(w.trace_gap_s * NS), reservoir_size=r.reservoir_size,
                                  slow_traces=r.slow_traces, max_signatures=r.max_signatures, seed=r.seed)  # fmt: skip
        self.regressions = RegressionDetector(
            DetectorSettings(
                baseline_windows=r.baseline_windows,
                fdr=r.fdr,
                min_requests=r.min_requests,
                min_samples=r.min_samples,
                min_latency_ratio=r.min_latency_ratio,
                reservoir_size=r.reservoir_size,
                seed=r.seed,
            )
        )
        self.judge = ProofJudge(settle_ns=int(p.settle_s * NS), slice_ns=int(p.slice_s * NS),
                                max_builds=p.max_builds, max_keys=p.max_keys)  # fmt: skip
        # Filled while stage 1 decodes a batch (and with the graph's contracts before it starts), drained per batch.
        self.inbox: deque[IncidentEvent | ProofContract] = deque()
        self._occurrences: dict[str, int] = {}
        self._cli_contracts: set[str] = set()

    def on_trace(self, trace: ClosedTrace) -> set[tuple[Hashable, int]] | None:
        """Count a closed trace; returns the input sources its statistics window now holds (to pin)."""
        self.judge.on_trace(trace)
        return self.stats.add(trace)

    def on_log(self, record: LogRecord) -> None:
        self.judge.on_log(record)

    def drain(self, out: StageOutput) -> None:
        """Take what arrived in the inbox: incidents (counted, contracted) and contracts."""
        rows = []
        while self.inbox:
            item = self.inbox.popleft()
            if isinstance(item, IncidentEvent):
                self.judge.on_incident(item)
                contract = self._contract_for(item)
                if contract is None:
                    continue
            else:
                contract = item
                self._cli_contracts.add(contract.fingerprint)
            self.judge.on_contract(contract)
            rows.append(contract_row(contract))
        if rows:
            out.graph.extra.append((CONTRACT_UPSERT, rows))

    def _contract_for(self, incident: IncidentEvent) -> ProofContract | None:
        """The incident's automatic contract, its floor from the defect's rate so far on the buggy build."""
        if incident.fingerprint in self._cli_contracts:
            return None  # a contract given by a person wins
        n = self._occurrences[incident.fingerprint] = self._occurrences.get(incident.fingerprint, 0) + 1
        c = incident.culprit
        routes = {incident.culprit.route, incident.victim.route} - {""}
        requests = self.judge.requests_on(c.service, incident.victim.version or c.version, routes)
        return contract_from_incident(incident, "", occurrences=n, requests=max(requests, n),
                                      watch_s=self.settings.proof.watch_s,
                                      now_ms=incident.detected_at_unix_ms)  # fmt: skip

    def close_until(self, watermark_ns: int, open_since_ns: int | None, out: StageOutput) -> None:
        k = self.settings.kafka
        for window in self.stats.close_until(watermark_ns, open_since_ns):
            out.release.extend(window.sources)
            out.graph.extra.append((STATS_STATEMENT, stats_rows(window)))
            findings = self.regressions.on_window(window)
            if findings.regressions:
                out.graph.extra.append((REGRESSION_UPSERT, [regression_row(e) for e in findings.regressions]))
                out.produce.extend(
                    Outbound(k.incidents_topic, e.fingerprint.encode(), e.model_dump_json().encode())
                    for e in findings.regressions
                )
        verdicts = self.judge.close_until(watermark_ns)
        if verdicts:
            out.graph.extra.append((VERDICT_UPSERT, [verdict_row(v) for v in verdicts]))
            out.produce.extend(
                Outbound(k.verdicts_topic, v.fingerprint.encode(), v.model_dump_json().encode()) for v in verdicts
            )
