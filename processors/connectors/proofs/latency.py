"""The proof judge's latency rule: whether a build ended a latency regression, on its share of slow requests.

A latency contract (``latency:<route>:><threshold>ms``) counts a request on its route as slow when it took longer
than the threshold (a bound of the judge's latency grid, at or above the baseline's p95). Three builds give the
evidence: the *regressed* build (the contract's: the receipt's *before*), the *baseline* build before the regression
(the contract's ``baseline_version``, when a version comparison flagged it) and the build judged (*after*).

A share of slow requests is never zero, so a build is looked at twice only, each look at ``alpha / 2``: once it
has served the requests planned from the before counts (``floor``: at least the contract's ``min_requests``), and
when its watch ends. At a look: ``NOT_FIXED`` when its share is significantly above the baseline's (one-sided
conditional binomial); else ``FIXED`` when it served ``floor`` requests and its share is significantly below the
regressed build's; else, at the end of the watch, ``INSUFFICIENT``. See
:data:`~processors.connectors.proofs.verdicts.LATENCY_RULE`, which every receipt carries.
"""

from __future__ import annotations

from processors.connectors.proofs.contracts import NOMINAL_SHARE, LatencySignature
from processors.connectors.proofs.decision import Decision, Rule, decided
from processors.connectors.proofs.tallies import Bound, Build, Matched, Tally, Watch
from processors.connectors.proofs.verdicts import (
    FIXED,
    INSUFFICIENT,
    LATENCY_RULE,
    LATENCY_TEST,
    LOOKS,
    NOT_FIXED,
    ranked,
    receipt,
    requests_for_share,
)
from processors.lib.stat_tests import conditional_binomial


def slow_requests(sig: LatencySignature, t: Tally) -> Matched:
    """The requests on the contract's route in ``t``, and those over its threshold (exact: the threshold is a bound
    of the histogram's grid)."""
    requests = slow = 0
    places: dict[str, int] = {}
    for (label, op), n in t.routes.items():
        if sig.matches_route(label, op):
            over = sum(m for b, m in t.latency.get((label, op), {}).items() if b > sig.bucket)
            requests, slow = requests + n, slow + over
            if over:
                places[f"{label} slower than {sig.threshold_ms:g} ms"] = over
    return Matched(slow, requests, ranked(places))


def judge_latency(bound: Bound, build: Build, watch: Watch, now: Matched, must: int, over: bool,
                  old: Matched | None, base: Matched | None, horizon_ns: int) -> list[Decision]:  # fmt: skip
    """NOT_FIXED, FIXED or INSUFFICIENT for ``build`` at one of its two looks; ``old`` and ``base`` are the regressed
    and the baseline builds' counts on the contract (None: not seen by this judge)."""
    c, sig = bound.contract, bound.signature
    assert isinstance(sig, LatencySignature)
    before = old or Matched(0, 0, [])
    alpha_look = c.alpha / LOOKS
    share = base.count / base.requests if base is not None and base.requests else NOMINAL_SHARE
    planned = requests_for_share(before.count, before.requests, share, alpha_look) if before.requests else None
    needed = max(c.min_requests, planned or 0)
    first = planned is not None and now.requests >= needed and not watch.planned_look
    watch.planned_look = watch.planned_look or first
    if not (first or over) or not now.requests or NOT_FIXED in watch.emitted or FIXED in watch.emitted:
        return []
    p_drop = (conditional_binomial(before.count, before.requests, now.count, now.requests, "less").p_value
              if before.requests else None)  # fmt: skip
    p_still = (conditional_binomial(base.count, base.requests, now.count, now.requests, "greater").p_value
               if base is not None and base.requests else None)  # fmt: skip
    outcome, rule = "", Rule.SHORT_SLOW
    if p_still is not None and p_still <= alpha_look:
        outcome, rule = NOT_FIXED, Rule.STILL_SLOW
    elif p_drop is not None and p_drop <= alpha_look and now.requests >= needed:
        outcome, rule = FIXED, Rule.BACK_TO_NORMAL
    elif over and not watch.emitted:
        outcome, rule = INSUFFICIENT, Rule.NOTHING_TO_DROP if planned is None else Rule.SHORT_SLOW
    if not outcome:
        return []
    numbers = receipt(build, now, must, c, before.count, before.requests, now.count, now.requests, LATENCY_TEST,
                      p_drop, horizon_ns, floor=needed, needed=needed, looks=LOOKS, rule=LATENCY_RULE,
                      threshold_ms=sig.threshold_ms, baseline=(base.count, base.requests) if base else None,
                      baseline_p_value=p_still)  # fmt: skip
    return [decided(bound, build, outcome, rule, now, numbers, before=old, before_version=bound.version, floor=needed,
                    needed=needed, p_value=p_drop, must_seen=must, threshold_ms=sig.threshold_ms, baseline=base,
                    baseline_version=c.baseline_version, baseline_share=share, p_still=p_still)]  # fmt: skip
