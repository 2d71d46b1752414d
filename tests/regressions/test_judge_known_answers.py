"""Known answers for every branch of the proof judge, with the arithmetic that gives them.

FIXED needs a before count on the same signature, at least the zero-error floor of clean requests from the before
rate's exact upper bound, and the one-sided conditional binomial test of after < before significant at alpha / 2
(two looks). With 0 errors after, that test's p-value is (n_before / (n_before + n_after)) ** k_before.
"""

from __future__ import annotations

import math

import pytest

from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE
from processors.model.contract import ProofContract
from processors.model.outputs import VerdictEvent
from tests.regressions.builders import MS, T0, S, request
from tests.regressions.test_proof_judge import Feed

ALPHA = 0.05
ROUTE = "/split/custom"


def _contract(route: str = "*") -> ProofContract:
    return ProofContract(signature=f"error:{route}:RoundingError", fingerprint="fp", watch_s=60, alpha=ALPHA,
                         service="split", version="1.0")  # fmt: skip


def _traffic(feed: Feed, version: str, start_ns: int, requests: int, errors: int, *, route: str = ROUTE,
             error_route: str | None = None, exception: str = "RoundingError") -> None:  # fmt: skip
    """``requests`` requests within 20 s of ``start_ns``; ``errors`` of them (spread out) fail with ``exception``
    on ``error_route`` (default: the same route)."""
    step = max(1, 20 * S // max(requests, 1))
    failing = {round(i * requests / errors) for i in range(errors)} if errors else set()
    for j in range(requests):
        fails = j in failing
        trace = request(start_ns + j * step, version, route=(error_route or route) if fails else route,
                        exception=exception if fails else "")  # fmt: skip
        feed.add(trace.end_ns, trace)


def _judge(before: tuple[int, int], after: tuple[int, int]) -> list[VerdictEvent]:
    judge = ProofJudge()
    judge.on_contract(_contract())
    feed = Feed(judge, tick_ns=5 * S)
    _traffic(feed, "1.0", T0, before[1], before[0])
    _traffic(feed, "1.1", T0 + 100 * S, after[1], after[0])
    return feed.run(T0, T0 + 200 * S)


def test_two_in_twelve_then_none_in_eight_is_insufficient() -> None:
    """p = (12 / 20) ** 2 = 0.36: no proof. 12 * (0.025 ** -0.5 - 1) = 63.9 clean requests would be: 56 more."""
    [v] = _judge((2, 12), (0, 8))
    assert v.outcome == INSUFFICIENT
    r = v.receipt
    assert (r.before_errors, r.before_requests, r.after_errors, r.after_requests) == (2, 12, 0, 8)
    assert r.p_value == pytest.approx(0.36)
    assert r.requests_needed == 56 and "56 more" in v.reason


def test_a_signature_never_seen_before_cannot_be_shown_gone() -> None:
    [v] = _judge((0, 500), (0, 500))
    assert v.outcome == INSUFFICIENT and v.receipt.before_errors == 0
    assert "nothing to show a drop from" in v.reason


def test_forty_in_ten_thousand_then_none_in_a_thousand_is_fixed() -> None:
    """p = (10000 / 11000) ** 40 = 0.0221 <= 0.025. The floor: ln(0.05) / ln(1 - 0.005443) = 549 (0.005443, the
    exact upper bound of 40/10000); the test needs 10000 * (0.025 ** -(1/40) - 1) = 966.1, so 967 <= 1000."""
    [v] = _judge((40, 10_000), (0, 1_000))
    assert v.outcome == FIXED
    r = v.receipt
    assert (r.before_errors, r.before_requests, r.after_errors) == (40, 10_000, 0)
    assert r.floor == math.ceil(math.log(ALPHA) / math.log1p(-0.00544292)) == 549
    assert r.after_requests >= 967 and r.p_value is not None
    assert r.p_value == pytest.approx((10_000 / (10_000 + r.after_requests)) ** 40)
    assert r.p_value <= ALPHA / 2 and r.looks == 2 and r.alpha == ALPHA
    assert "p = " in v.reason and "floor 549" in v.reason


def test_a_fix_that_moved_the_error_to_another_route_is_not_fixed() -> None:
    """The contract names /split/custom; the build no longer fails there but fails /split/even the same way."""
    [v] = _moved()
    assert v.outcome == NOT_FIXED
    assert "moved" in v.reason and v.receipt.still_happens_at == ["POST /split/even in split.handlers.even"]


def _moved() -> list[VerdictEvent]:
    judge = ProofJudge()
    judge.on_contract(_contract(f"POST {ROUTE}"))
    feed = Feed(judge, tick_ns=5 * S)
    _traffic(feed, "1.0", T0, 200, 20)
    _traffic(feed, "1.1", T0 + 100 * S, 200, 20, error_route="/split/even")
    return feed.run(T0, T0 + 200 * S)


def test_a_build_with_more_errors_is_worse() -> None:
    """Another error on twice the requests' share: worse overall than 1.0, roll back."""
    judge = ProofJudge()
    judge.on_contract(_contract())
    feed = Feed(judge, tick_ns=5 * S)
    _traffic(feed, "1.0", T0, 300, 3)
    _traffic(feed, "1.1", T0 + 100 * S, 300, 40, exception="KeyError")
    [v] = feed.run(T0, T0 + 200 * S)
    assert v.outcome == WORSE and v.rollback
    assert v.receipt.p_value is not None and v.receipt.p_value <= ALPHA / 2


def test_looks_are_bounded_whatever_the_tick() -> None:
    """Ticking every 100 ms instead of 5 s gives the same FIXED at the same count: a look is taken when the count
    of clean requests makes the drop significant, not at every tick, so ticking often cannot inflate alpha."""
    judge = ProofJudge()
    judge.on_contract(_contract())
    feed = Feed(judge, tick_ns=100 * MS)
    _traffic(feed, "1.0", T0, 10_000, 40)
    _traffic(feed, "1.1", T0 + 100 * S, 1_000, 0)
    [v] = feed.run(T0, T0 + 200 * S)
    assert v.outcome == FIXED and v.receipt.p_value is not None and v.receipt.p_value <= ALPHA / 2
