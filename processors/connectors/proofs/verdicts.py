"""How a verdict is written up: the receipt (the numbers to recompute it), the event from the judge's decision, and
where it happened."""

from __future__ import annotations

import functools
from collections.abc import Iterable

from processors.connectors.proofs.contracts import ErrorSignature
from processors.connectors.proofs.decision import Decision
from processors.connectors.proofs.render import reason
from processors.connectors.proofs.tallies import Bound, Build, Matched, Tally
from processors.lib.stat_tests import rate_interval
from processors.model.contract import ANY_ROUTE, ProofContract
from processors.model.verdict import Receipt, VerdictEvent

FIXED, NOT_FIXED, WORSE, INSUFFICIENT = "FIXED", "NOT_FIXED", "WORSE", "INSUFFICIENT"
LOOKS = 2  # the judge decides FIXED at two looks at most: once enough requests were served, and when the watch ends
SIGNATURE_TEST = ("one-sided conditional binomial (exact): signature rate after < before, at alpha/2 per look; "
                  "interval: exact 95% CI of the signature's rate after")  # fmt: skip
FIXED_RULE = (
    "FIXED needs a before count > 0 on the same signature and denominator, at least `floor` requests without it "
    "(floor = ln(alpha) / ln(1 - p_up), p_up the exact 95% upper bound of the before rate), and the one-sided "
    "conditional binomial test of after < before significant at alpha / looks; else INSUFFICIENT with the requests "
    "still needed (`requests_needed`)"
)
LATENCY_TEST = ("one-sided conditional binomial (exact) on the share of requests over the threshold: after < before "
                "(the regressed build), at alpha/2 per look; interval: exact 95% CI of the share after")  # fmt: skip
LATENCY_RULE = (
    "latency: a request is slow when it took longer than `threshold_ms` (the latency grid's bound at or above the "
    "baseline's p95). The build is looked at twice, each look at alpha / looks: when it has served `floor` requests "
    "on the route (the larger of the contract's min_requests and the fewest requests whose share over the threshold, "
    "were it the baseline's, would test significant: planned from the before counts) and when the watch ends. "
    "At a look: NOT_FIXED when its share is "
    "significantly above the baseline build's (`baseline_slow` / `baseline_requests`, one-sided conditional "
    "binomial); else FIXED when it served at least `floor` requests and its share is significantly below the "
    "regressed build's (one-sided conditional binomial, after < before); else, at the watch's end, INSUFFICIENT"
)
WORSE_TEST = ("one-sided conditional binomial (exact): total error rate after > before, at alpha/2 per look; "
              "interval: exact 95% CI of the error rate after")  # fmt: skip


def receipt(
    build: Build,
    now: Matched,
    must: int,
    c: ProofContract,
    before_errors: int,
    before_requests: int,
    after_errors: int,
    after_requests: int,
    test: str,
    p_value: float | None,
    horizon_ns: int,
    *,
    floor: int = 0,
    needed: int | None = None,
    looks: int = LOOKS,
    rule: str | None = None,
    threshold_ms: float | None = None,
    baseline: tuple[int, int] | None = None,
    baseline_p_value: float | None = None,
) -> Receipt:
    """The numbers behind a verdict (``needed``: the requests the build must serve, default the contract's floor)."""
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
        requests_needed=max(0, (c.min_requests if needed is None else needed) - now.requests),
        alpha=c.alpha,
        looks=looks,
        floor=floor,
        rule=rule if rule is not None else FIXED_RULE if test == SIGNATURE_TEST else test,
        threshold_ms=threshold_ms,
        baseline_slow=baseline[0] if baseline else None,
        baseline_requests=baseline[1] if baseline else None,
        baseline_p_value=baseline_p_value,
        window_start_unix_ms=build.first_ns / 1e6,
        window_end_unix_ms=min(horizon_ns, build.last_ns) / 1e6,
        build_identified_by=build.identified_by,
    )


def verdict(bound: Bound, build: Build, decision: Decision) -> VerdictEvent:
    """The published verdict of a decision; its reason is the decision in words (:mod:`.render`)."""
    return VerdictEvent(
        fingerprint=bound.contract.fingerprint,
        contract=bound.contract.signature,
        service=build.service,
        version=build.version,
        commit=build.revision,
        outcome=decision.outcome,
        rollback=decision.outcome == WORSE,
        reason=reason(decision),
        receipt=decision.receipt,
    )


@functools.lru_cache(maxsize=4096)
def requests_for_share(slow_before: int, requests_before: int, share: float, alpha: float,
                       cap: int = 100_000) -> int | None:  # fmt: skip
    """The fewest after-requests ``n`` for which ``ceil(share * n)`` slow ones would make the one-sided conditional
    binomial test of after < before significant at ``alpha``; None when no ``n`` up to ``cap`` would (the before share
    is not above ``share``). A planning number from the before counts only, so the look it times is fixed in advance.
    (The test's p-value is ``P(X <= k_after)``, X binomial over the ``k_before + k_after`` slow requests with the
    after side's share of the traffic: :func:`~processors.lib.stat_tests.conditional_binomial`, vectorised.)
    """
    if requests_before <= 0 or slow_before <= share * requests_before:
        return None
    import numpy as np  # here, not at the top: see processors.lib.stat_tests._special
    from scipy.special import bdtr  # binomial CDF, as processors.lib.stat_tests.binomial_tail

    n = np.arange(1, cap + 1)
    slow = np.minimum(n, np.ceil(share * n)).astype(np.int64)  # integers: a float count is deprecated in bdtr
    p = bdtr(slow, slow_before + slow, n / (requests_before + n))
    hits = np.flatnonzero(p <= alpha)
    return int(hits[0]) + 1 if hits.size else None


def verdicts_by_version(verdicts: Iterable[VerdictEvent]) -> dict[str, list[str]]:
    """Outcomes per version, in emission order (a reading aid for logs and tests)."""
    out: dict[str, list[str]] = {}
    for v in verdicts:
        out.setdefault(v.version, []).append(v.outcome)
    return out


def ranked(places: dict[str, int]) -> list[str]:
    return [where for where, _ in sorted(places.items(), key=lambda kv: (-kv[1], kv[0]))]


def new_errors(now: Tally, before: Tally) -> list[str]:
    """Error sites whose rate went up from the earlier build, most frequent first."""
    grown = {k: n for k, n in now.failures.items() if n / now.requests > before.failures.get(k, 0) / before.requests}
    places: dict[str, int] = {}
    for k, n in grown.items():
        places[f"{k[0]}: {k[2]}"] = n
    return ranked(places)[:5]


def moved_errors(bound: Bound, t: Tally, before: Tally | None) -> list[str]:
    """Where the contract's error now happens on *other* routes, at a higher rate than before (a fix that moved
    the error rather than removing it); [] for collision contracts and route-less signatures."""
    sig = bound.signature
    if not isinstance(sig, ErrorSignature) or sig.route == ANY_ROUTE or not t.requests:
        return []
    places: dict[str, int] = {}
    for (label, op, error), n in t.failures.items():
        if sig.matches_route(label, op) or not sig.matches_error(error):
            continue
        earlier = before.failures.get((label, op, error), 0) / before.requests if before and before.requests else 0
        if n / t.requests > earlier:
            for where, m in t.sites.get((label, op, error), {label: n}).items():
                places[where] = places.get(where, 0) + m
    return ranked(places)
