"""The proof judge's rules on one build of a contract's service, on its settled counts (the ledger's).

Each build is judged against:

* the build first seen just before it (``WORSE``: its total error rate is higher, one-sided conditional binomial
  test at ``alpha / 2`` at each of two looks: when it reaches ``min_requests``, and when the watch ends);
* the latest earlier build where the signature occurred (the receipt's *before*).

Outcomes, each at most once per (contract, build): ``NOT_FIXED`` as soon as the signature occurs on the build
(with where: routes and functions, or the colliding functions); ``FIXED`` once the build served ``min_requests``
matching requests without it and the must-start event was seen; ``WORSE`` (rollback) when the error-rate test
says so, whatever the fix does; ``INSUFFICIENT`` when the watch (``watch_s`` of event time from the build's first
request) ends without another verdict, with the requests still needed. A ``FIXED`` can be followed by a
``NOT_FIXED`` (a late collision) or a ``WORSE``; nothing follows a ``WORSE``.

Latency contracts (a regression's) are judged on each build's latency histogram, by the rule of
:mod:`~processors.connectors.proofs.latency`; every outcome then passes the sampling gate
(:mod:`~processors.connectors.proofs.sampling`).
"""

from __future__ import annotations

from processors.connectors.proofs.contracts import LatencySignature
from processors.connectors.proofs.decision import Decision, Rule, decided
from processors.connectors.proofs.latency import judge_latency
from processors.connectors.proofs.ledger import Ledger
from processors.connectors.proofs.matching import Occurrences, matched
from processors.connectors.proofs.sampling import compared, gate
from processors.connectors.proofs.tallies import Bound, Build, Matched, Tally, Watch
from processors.connectors.proofs.verdicts import (
    FIXED,
    INSUFFICIENT,
    LOOKS,
    NOT_FIXED,
    SIGNATURE_TEST,
    WORSE,
    WORSE_TEST,
    moved_errors,
    new_errors,
    receipt,
    verdict,
)
from processors.lib.stat_tests import conditional_binomial, rate_interval, requests_to_show_drop
from processors.model.outputs import VerdictEvent
from processors.model.units import NS, zero_error_floor


class BuildRules:
    """The verdict rules, on the judge's ledger (settled counts, horizon) and its occurrences of signatures."""

    def __init__(self, ledger: Ledger, occurrences: Occurrences) -> None:
        self.ledger = ledger
        self.occurrences = occurrences

    def _matched(self, bound: Bound, t: Tally) -> Matched:
        return matched(bound, t, self.occurrences)

    def judge(self, bound: Bound, build: Build, earlier: list[Build], watch: Watch) -> list[VerdictEvent]:
        """The verdicts on ``build`` now (at most one per outcome over the watch); ``earlier``: the service's builds
        first seen before it, oldest first."""
        c = bound.contract
        t = self.ledger.settled(build)
        now = self._matched(bound, t)
        reached = now.requests >= c.min_requests
        over = self.ledger.horizon >= build.first_ns + int(c.watch_s * NS)
        must = t.events.get(c.must_start, 0)
        out: list[Decision] = []
        if WORSE in watch.emitted:
            watch.closed = watch.closed or over
            return []
        look = over or (reached and not watch.looked)
        watch.looked = watch.looked or reached
        previous = earlier[-1] if earlier else None
        if look and previous is not None and self.ledger.settled(previous).requests and t.requests:
            p = self.ledger.settled(previous)
            test = conditional_binomial(p.errors, p.requests, t.errors, t.requests, "greater")
            if test.p_value <= c.alpha / LOOKS:
                numbers = receipt(build, now, must, c, p.errors, p.requests, t.errors, t.requests, WORSE_TEST,
                                  test.p_value, self.ledger.horizon)  # fmt: skip
                out.append(decided(bound, build, WORSE, Rule.WORSE, Matched(t.errors, t.requests, []), numbers,
                                   before=Matched(p.errors, p.requests, []), before_version=previous.version,
                                   p_value=test.p_value, signature_seen=now.count > 0,
                                   new_errors=tuple(new_errors(t, p))))  # fmt: skip
        if not out and isinstance(bound.signature, LatencySignature):
            out += self._latency(bound, build, earlier, watch, now, must, over)
        elif not out:
            out += self._signature(bound, build, earlier, watch, now, t, must, over)
        others = compared(earlier, (bound.version, c.baseline_version), self.ledger.settled,
                          lambda b: self._matched(bound, self.ledger.settled(b)).count > 0)  # fmt: skip
        gated = gate(out, bound, build, t, others, watch.emitted)
        watch.emitted.extend(d.outcome for d in gated)
        watch.closed = watch.closed or over
        return [verdict(bound, build, d) for d in gated]

    def _signature(self, bound: Bound, build: Build, earlier: list[Build], watch: Watch, now: Matched, t: Tally,
                   must: int, over: bool) -> list[Decision]:  # fmt: skip
        """NOT_FIXED, FIXED or INSUFFICIENT on the contract's signature (see :data:`FIXED_RULE`)."""
        c = bound.contract
        before = next((b for b in reversed(earlier) if self._matched(bound, self.ledger.settled(b)).count), None)
        old = self._matched(bound, self.ledger.settled(before)) if before is not None else Matched(0, 0, [])
        alpha_look = c.alpha / LOOKS
        floor = zero_error_floor(rate_interval(old.count, old.requests)[1], c.alpha) if old.count else 0
        needed = max(floor, requests_to_show_drop(old.count, old.requests, alpha_look) or 0)
        p_value = (conditional_binomial(old.count, old.requests, now.count, now.requests, "less").p_value
                   if old.requests and now.requests else None)  # fmt: skip
        moved = moved_errors(bound, t, self.ledger.settled(before) if before is not None else None)
        outcome, rule = "", Rule.SHORT
        if now.count:
            outcome, rule = NOT_FIXED, Rule.RECURS
        elif moved:
            outcome, rule = NOT_FIXED, Rule.MOVED
            now = Matched(0, now.requests, moved)
        elif old.count and now.requests >= needed and (must or not c.must_start) and p_value is not None \
                and p_value <= alpha_look:  # fmt: skip
            outcome, rule = FIXED, Rule.DROPPED
        elif over and not watch.emitted:
            outcome = INSUFFICIENT
            rule = Rule.NEVER_SEEN if not old.count else Rule.NO_MUST_START if now.requests >= needed else Rule.SHORT
        if not outcome or outcome in watch.emitted or (outcome == FIXED and NOT_FIXED in watch.emitted):
            return []
        numbers = receipt(build, now, must, c, old.count, old.requests, now.count, now.requests, SIGNATURE_TEST,
                          p_value, self.ledger.horizon, floor=floor, needed=needed, looks=LOOKS)  # fmt: skip
        return [decided(bound, build, outcome, rule, now, numbers, before=old if before is not None else None,
                        before_version=before.version if before is not None else "", floor=floor, needed=needed,
                        p_value=p_value, must_seen=must, moved=tuple(moved))]  # fmt: skip

    def _latency(self, bound: Bound, build: Build, earlier: list[Build], watch: Watch, now: Matched, must: int,
                 over: bool) -> list[Decision]:  # fmt: skip
        """A latency contract's verdict on ``build``: the regressed and the baseline builds' shares are the evidence."""
        c = bound.contract
        regressed = next((b for b in earlier if b.version == bound.version), None)
        baseline = next((b for b in earlier if c.baseline_version and b.version == c.baseline_version), None)
        old = self._matched(bound, self.ledger.settled(regressed)) if regressed is not None else None
        base = self._matched(bound, self.ledger.settled(baseline)) if baseline is not None else None
        return judge_latency(bound, build, watch, now, must, over, old, base, self.ledger.horizon)
