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
    verdict,
)
from processors.lib.stat_tests import conditional_binomial
from processors.model.verdict import VerdictEvent


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
                  old: Matched | None, base: Matched | None, horizon_ns: int) -> list[VerdictEvent]:  # fmt: skip
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
    slow = f"{now.count} of {now.requests} requests of {build.version} over {sig.threshold_ms:g} ms"
    was = (f"{before.count}/{before.requests} on {bound.version} (regressed)" if old is not None
           else f"{bound.version} (regressed) not seen by this judge")  # fmt: skip
    if base is not None:
        was += f", {base.count}/{base.requests} on {c.baseline_version} (baseline)"
    outcome = reason = ""
    if p_still is not None and p_still <= alpha_look:
        outcome = NOT_FIXED
        reason = (f"{str(sig)!r} still regressed: {slow}, vs {was}: slower than the baseline, p = {p_still:.3g} <= "
                  f"{alpha_look:g} (alpha {c.alpha:g} over {LOOKS} looks)")  # fmt: skip
    elif p_drop is not None and p_drop <= alpha_look and now.requests >= needed:
        outcome = FIXED
        reason = (f"{str(sig)!r} back to normal: {slow}, vs {was}: p = {p_drop:.3g} <= {alpha_look:g} (alpha "
                  f"{c.alpha:g} over {LOOKS} looks), floor {needed}")  # fmt: skip
    elif over and not watch.emitted:
        outcome = INSUFFICIENT
        if planned is None:
            reason = (f"{slow}; the regressed build's share ({was}) is not above the baseline's {share:.3g}: "
                      "nothing to show a drop from")  # fmt: skip
        else:
            p_text = "n/a" if p_drop is None else f"{p_drop:.3g}"
            reason = (f"{slow}, vs {was}: p = {p_text} (test at {alpha_look:g}) with {now.requests} of the {needed} "
                      f"requests planned in {c.watch_s:g}s")  # fmt: skip
    if not outcome:
        return []
    numbers = receipt(build, now, must, c, before.count, before.requests, now.count, now.requests, LATENCY_TEST,
                      p_drop, horizon_ns, floor=needed, needed=needed, looks=LOOKS, rule=LATENCY_RULE,
                      threshold_ms=sig.threshold_ms, baseline=(base.count, base.requests) if base else None,
                      baseline_p_value=p_still)  # fmt: skip
    return [verdict(bound, build, outcome, reason, numbers)]
