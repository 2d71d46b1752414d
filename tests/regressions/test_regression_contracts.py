"""Regressions as incidents of their own kind: their automatic contracts, and the judge's latency rule.

A latency contract names the requests on a route slower than the latency grid's bound at or above the baseline's
p95. Every build's requests are counted per grid bucket, so the share over the threshold is exact for any build,
also for the traffic seen before the contract existed. The judge looks twice (when the build has served the planned
requests, and when the watch ends), each look at alpha / 2, with the one-sided conditional binomial test.
"""

from __future__ import annotations

import math

import pytest
from pydantic import SecretStr

from bench.gitlab_server import FakeGitLab
from processors.api.telemetry import Telemetry
from processors.connectors.proofs.config import ProofConfig
from processors.connectors.proofs.contracts import (
    GRID_MIN,
    GRID_STEPS,
    LatencySignature,
    contract_from_regression,
    grid_bound_ms,
    grid_threshold,
    latency_bucket,
    parse_signature,
)
from processors.connectors.proofs.desk import ProofDesk
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.tallies import Tally
from processors.connectors.proofs.verdicts import (
    FIXED,
    INSUFFICIENT,
    LATENCY_RULE,
    LATENCY_TEST,
    NOT_FIXED,
    requests_for_share,
)
from processors.lib.stat_tests import conditional_binomial
from processors.model.contract import ProofContract
from processors.model.outputs import VerdictEvent
from processors.model.regression import Evidence, RegressionEvent
from sinks.gitlab import GitLabSink
from sinks.gitlab.state import IssueState
from tests.gitlab.helpers import PROJECT, TOKEN, deliver, recurrence, regression, verdict
from tests.regressions.builders import MS, T0, S, request
from tests.regressions.test_proof_judge import Feed

ALPHA = 0.05
ROUTE = "/split/even"
LABEL = f"POST {ROUTE}"
FAST_MS, SLOW_MS = 20.0, 80.0
THRESHOLD = grid_threshold(50.0)  # the bucket whose bound is 50.1187 ms


# ---- signatures and the grid ----------------------------------------------------------------------------------


def test_the_grid_counts_a_threshold_exactly_and_signatures_round_trip() -> None:
    """A duration lands in the bucket whose bound is the first at or above it; a signature names that bound."""
    for ms in (0.2, 1.0, 9.99, 24.6, 50.0, 88.9, 1234.5):
        k = grid_threshold(ms)
        assert grid_bound_ms(k) >= ms * (1 - 1e-6) and grid_bound_ms(k - 1) < ms
        sig = LatencySignature(LABEL, k)
        parsed = parse_signature(str(sig))
        assert parsed == sig and isinstance(parsed, LatencySignature)
    assert latency_bucket(int(49.0 * MS)) == THRESHOLD and latency_bucket(int(50.2 * MS)) == THRESHOLD + 1
    assert str(LatencySignature("POST /a:b", THRESHOLD)) == "latency:POST /a:b:>50.1187ms"
    assert latency_bucket(10 * MS) == GRID_STEPS and latency_bucket(0) == latency_bucket(1) == GRID_MIN
    for bad in ("latency:POST /x", "latency:POST /x:50ms", "latency:POST /x:>abcms", "latency::>5ms"):
        with pytest.raises(ValueError):
            parse_signature(bad)


def _evidence(comparison: str, before_version: str, before_p95: float, metric: str = "latency",
              p_adjusted: float = 1e-9) -> Evidence:  # fmt: skip
    return Evidence(comparison=comparison, metric=metric, test="Mann-Whitney U", before_version=before_version,
                    after_version="2.0", before_windows=["w0"], after_window="w1", before_requests=200,
                    before_errors=0, after_requests=200, after_errors=0, before_rate=0.0, after_rate=0.0,
                    before_p50_ms=20, after_p50_ms=80, before_p95_ms=before_p95, after_p95_ms=85,
                    before_samples=200, after_samples=200, statistic=1, effect=0.9, p_value=1e-10,
                    p_adjusted=p_adjusted, ratio_low=None, ratio_high=None)  # fmt: skip


def _latency_regression(*evidence: Evidence, version: str = "2.0", fingerprint: str = "fp-lat") -> RegressionEvent:
    return RegressionEvent(fingerprint=fingerprint, occurrence=f"o-{version}", service="split", operation=ROUTE,
                           signature=f"latency:{LABEL}", metric="latency", version=version,
                           previous_version="1.0", commit="c", window="w1", window_start_unix_ms=0,
                           window_end_unix_ms=1, summary="s", evidence=list(evidence), critical_path=[],
                           detected_at_unix_ms=1)  # fmt: skip


def test_a_latency_regression_contract_takes_the_previous_versions_p95_as_its_threshold() -> None:
    """The version comparison's before p95 (the build before the regression) wins over a more significant baseline
    comparison; the threshold is the grid bound at or above it, and the baseline build is named."""
    event = _latency_regression(_evidence("baseline", "2.0", 70.0, p_adjusted=1e-20), _evidence("version", "1.0", 49.0))
    c = contract_from_regression(event, "", automatic=True)
    assert c.signature == f"latency:{LABEL}:>50.1187ms" and c.baseline_version == "1.0" and c.automatic
    assert (c.service, c.version, c.routes, c.baseline_rate, c.min_requests) == ("split", "2.0", [ROUTE], 0.05, 59)
    only_baseline = contract_from_regression(_latency_regression(_evidence("baseline", "2.0", 70.0)), "")
    assert only_baseline.signature.endswith(f":>{grid_bound_ms(grid_threshold(70.0)):g}ms")
    assert only_baseline.baseline_version == "" and not only_baseline.automatic
    with pytest.raises(ValueError, match="no latency evidence"):
        contract_from_regression(_latency_regression(_evidence("version", "1.0", 49.0, metric="errors")), "")


def test_tallies_carry_latency_histograms_through_json() -> None:
    """The per-route histogram survives the graph round trip; a contribution stored before it loads empty."""
    t = Tally(requests=3, routes={(LABEL, ROUTE): 3}, latency={(LABEL, ROUTE): {THRESHOLD: 2, THRESHOLD + 9: 1}})
    assert Tally.from_json(t.to_json()) == t
    old = t.to_json().replace(', "latency": [["POST /split/even", "/split/even", [[68, 2], [77, 1]]]]', "")
    assert "latency" not in old and Tally.from_json(old).latency == {}


# ---- the judge's latency rule: known answers ------------------------------------------------------------------


def _contract(baseline_version: str = "1.0") -> ProofContract:
    return ProofContract(signature=str(LatencySignature(LABEL, THRESHOLD)), fingerprint="fp-lat", watch_s=60,
                         alpha=ALPHA, service="split", version="2.0", routes=[ROUTE], min_requests=59,
                         baseline_version=baseline_version, automatic=True)  # fmt: skip


def _traffic(feed: Feed, version: str, start_ns: int, requests: int, slow: int) -> None:
    """``requests`` requests within 1 s of ``start_ns`` (one settled slice per tick); ``slow`` of them take 80 ms."""
    slow_ones = {round(i * requests / slow) for i in range(slow)} if slow else set()
    for j in range(requests):
        trace = request(start_ns + j * (S // requests), version, route=ROUTE,
                        dur_ms=SLOW_MS if j in slow_ones else FAST_MS)  # fmt: skip
        feed.add(trace.end_ns, trace)


def _judge(new: tuple[int, int], *, baseline: tuple[int, int] = (10, 200), regressed: tuple[int, int] = (150, 200),
           baseline_version: str = "1.0") -> list[VerdictEvent]:  # fmt: skip
    """1.0 (baseline), 2.0 (regressed) and 2.1, each ``(slow, requests)``; verdicts on 2.1 only."""
    judge = ProofJudge()
    judge.on_contract(_contract(baseline_version))
    feed = Feed(judge, tick_ns=5 * S)
    _traffic(feed, "1.0", T0, baseline[1], baseline[0])
    _traffic(feed, "2.0", T0 + 20 * S, regressed[1], regressed[0])
    _traffic(feed, "2.1", T0 + 40 * S, new[1], new[0])
    verdicts = feed.run(T0, T0 + 200 * S)
    assert {v.version for v in verdicts} <= {"2.1"}
    return verdicts


def test_back_to_the_baseline_share_is_fixed_with_the_exact_test_in_the_receipt() -> None:
    """2.0: 150/200 over 50.1 ms; 2.1: 10/200, like 1.0. p = P(X <= 10 | 160, 1/2) ~ 1.6e-35 <= 0.025: FIXED."""
    [v] = _judge((10, 200))
    r = v.receipt
    assert v.outcome == FIXED and v.contract == f"latency:{LABEL}:>50.1187ms"
    assert (r.before_errors, r.before_requests, r.after_errors, r.after_requests) == (150, 200, 10, 200)
    expected = conditional_binomial(150, 200, 10, 200, "less").p_value
    assert r.p_value == expected and expected <= ALPHA / 2 and expected < 1e-30
    assert r.test == LATENCY_TEST and r.rule == LATENCY_RULE and (r.alpha, r.looks) == (ALPHA, 2)
    assert r.threshold_ms == 50.1187 and (r.baseline_slow, r.baseline_requests) == (10, 200)
    planned = requests_for_share(150, 200, 10 / 200, ALPHA / 2)
    assert planned is not None and r.floor == max(59, planned) <= r.after_requests
    assert r.baseline_p_value == conditional_binomial(10, 200, 10, 200, "greater").p_value > ALPHA / 2
    assert "back to normal" in v.reason and "10 of 200 requests of 2.1 over 50.1187 ms" in v.reason


def test_still_slower_than_the_baseline_build_is_not_fixed() -> None:
    """2.1: 100/200 slow against 1.0's 10/200: p(after > baseline) far below 0.025, NOT_FIXED, even though the share
    did drop from 2.0's 150/200 (a partial fix is not the regression gone)."""
    [v] = _judge((100, 200))
    r = v.receipt
    assert v.outcome == NOT_FIXED and "still regressed" in v.reason
    assert r.baseline_p_value == conditional_binomial(10, 200, 100, 200, "greater").p_value <= ALPHA / 2
    assert r.still_happens_at == ["POST /split/even slower than 50.1187 ms"]


def test_too_little_traffic_is_insufficient_at_the_end_of_the_watch_with_the_requests_still_needed() -> None:
    """20 requests of 2.1 (1 slow) never reach the 59-request floor: one look, at the watch's end, INSUFFICIENT."""
    [v] = _judge((1, 20))
    r = v.receipt
    assert v.outcome == INSUFFICIENT and r.after_requests == 20 and r.requests_needed == r.floor - 20 == 39
    assert r.p_value == conditional_binomial(150, 200, 1, 20, "less").p_value


def test_a_regressed_build_no_slower_than_the_baseline_gives_nothing_to_show_a_drop_from() -> None:
    """When the contracted build's share is not above the baseline's, no look is planned: INSUFFICIENT at the end."""
    [v] = _judge((10, 200), regressed=(9, 200))
    assert v.outcome == INSUFFICIENT and "nothing to show a drop from" in v.reason


def test_without_a_baseline_build_the_nominal_share_plans_the_look_and_only_the_drop_is_judged() -> None:
    """A regression flagged only against earlier windows names no baseline build: 5% plans the look, FIXED needs
    the exact test against the regressed build, and 'still slower than the baseline' cannot be claimed: 100/200
    against 150/200 is a significant drop (p = P(X <= 100 | 250, 1/2) ~ 8e-4), so it is FIXED."""
    [v] = _judge((10, 200), baseline_version="")
    assert v.outcome == FIXED and v.receipt.baseline_slow is None and v.receipt.baseline_p_value is None
    [partial] = _judge((100, 200), baseline_version="")
    p = conditional_binomial(150, 200, 100, 200, "less").p_value
    assert partial.outcome == FIXED and partial.receipt.p_value == p and 1e-4 < p <= ALPHA / 2


def test_the_planned_look_is_the_fewest_requests_a_baseline_share_would_show() -> None:
    """requests_for_share: the smallest n with ceil(share * n) slow ones significant (checked by brute force)."""
    for before, share in (((150, 200), 0.05), ((30, 100), 0.05), ((12, 400), 0.01)):
        n = requests_for_share(*before, share, ALPHA / 2)
        assert n is not None

        def shows(m: int, share: float = share, before: tuple[int, int] = before) -> bool:
            k = min(m, math.ceil(share * m))
            return conditional_binomial(*before, k, m, "less").p_value <= ALPHA / 2

        assert shows(n) and not any(shows(m) for m in range(1, n))
    assert requests_for_share(10, 200, 0.05, ALPHA / 2) is None


# ---- the desk: one contract per regression fingerprint ---------------------------------------------------------


def _desk() -> ProofDesk:
    return ProofDesk(ProofConfig(), telemetry=Telemetry("proof"), clock=lambda: 0)


def _error_regression_on(version: str, fingerprint: str = "fp-err") -> RegressionEvent:
    ev = _evidence("version", "1.0", 20.0, metric="errors").model_copy(
        update={"after_version": version, "after_errors": 20, "after_rate": 0.1}
    )
    return RegressionEvent(fingerprint=fingerprint, occurrence=f"o-{version}", service="split", operation=ROUTE,
                           signature=f"error:{LABEL}:ValueError", metric="errors", version=version,
                           previous_version="1.0", commit="c", window="w", window_start_unix_ms=0,
                           window_end_unix_ms=1, summary="s", evidence=[ev], critical_path=[],
                           detected_at_unix_ms=1)  # fmt: skip


def test_each_regression_fingerprint_gets_one_automatic_contract_moved_only_by_a_later_build() -> None:
    """Repeats on the same build are deduplicated; a recurrence on a later build moves the contract to it; a late
    window of an earlier build does not; a person's contract wins; a stored automatic one dedupes after a restart."""
    desk = _desk()
    for version, at in (("1.0", T0), ("2.0", T0 + 10 * S), ("2.1", T0 + 20 * S), ("2.2", T0 + 30 * S)):
        desk.on_trace(request(at, version, route=ROUTE), [])
    desk.on_event(_error_regression_on("2.0"), "p0")
    desk.on_event(_error_regression_on("2.0").model_copy(update={"occurrence": "again"}), "p0")
    desk.on_event(_latency_regression(_evidence("version", "1.0", 49.0)), "p0")
    made = list(desk._new_contracts)
    assert [(c.fingerprint, c.version, c.signature) for c in made] == [
        ("fp-err", "2.0", f"error:{LABEL}:ValueError"), ("fp-lat", "2.0", f"latency:{LABEL}:>50.1187ms")]  # fmt: skip
    assert all(c.automatic and c.routes == [ROUTE] for c in made)
    assert desk.telemetry.events["regressions_deduplicated"] == 1
    desk.on_event(_error_regression_on("2.2"), "p0")  # recurrence on a later build
    desk.on_event(_error_regression_on("2.1"), "p0")  # a late window of a build older than the contracted one
    assert [c.version for c in desk._new_contracts[2:]] == ["2.2"] and desk.telemetry.events[
        "regressions_recurred"
    ] == 1
    assert desk.judge._contracts["fp-err"].version == "2.2"

    person = ProofContract(signature="error:*:ValueError", fingerprint="fp-p", service="split", version="2.0")
    desk.on_event(person, "p0")
    desk.on_event(_error_regression_on("2.2", fingerprint="fp-p"), "p0")
    assert desk.judge._contracts["fp-p"].contract == person

    restarted = _desk()
    restarted.on_event(made[0], "p0")  # as the daemon loads it from the graph on start
    restarted.on_event(_error_regression_on("2.0"), "p0")
    assert len(restarted._new_contracts) == 1 and restarted.telemetry.events["regressions_deduplicated"] == 1


def test_a_regression_without_a_judgeable_signature_is_counted_not_contracted() -> None:
    """A latency regression whose evidence has no p95 makes no contract: a counted drop, never an exception."""
    desk = _desk()
    desk.on_event(_latency_regression(_evidence("version", "1.0", 0.0)), "p0")
    assert desk._new_contracts == [] and desk.telemetry.dropped["regression_without_contract"] == 1


# ---- GitLab: a recurrence is a regression of a build deployed after the verified fix ------------------------------


async def test_a_fixed_regression_issue_reopens_only_for_a_build_deployed_after_the_fix() -> None:
    """FIXED (window from 2.1's first request) closes the issue; 2.0 regressing again in a later window (a draining
    pod) is counted but late; 2.2, first seen after 2.1, reopens it. The issue keeps its chart and path table."""
    first = regression("errors", build_first_seen_unix_ms=1_000.0)
    fix_from = first.window_end_unix_ms + 60_000
    v = verdict(fingerprint=first.fingerprint, contract=first.signature, version="2.1", outcome=FIXED)
    v = v.model_copy(update={"receipt": v.receipt.model_copy(update={"window_start_unix_ms": fix_from})})
    draining = recurrence(first, 5)  # a window well after the fix, of the build that was fixed
    assert draining.window_start_unix_ms > fix_from
    later = recurrence(first, 6).model_copy(update={"version": "2.2", "build_first_seen_unix_ms": fix_from + 1})
    with FakeGitLab(token=TOKEN, project=PROJECT) as server:
        sink = GitLabSink(server.url, PROJECT, SecretStr(TOKEN), timeout_s=5.0)
        try:
            await deliver(sink, first, v)
            [issue] = server.issues()
            assert issue["state"] == "closed" and "```mermaid\nxychart-beta\n" in issue["description"]
            assert "| Owner | Before | After | Delta |" in issue["description"]
            await deliver(sink, draining)
            [issue] = server.issues()
            state = IssueState.parse(issue["description"])
            assert issue["state"] == "closed" and state is not None and state.occurrences == 2
            assert "reopened" not in sink.telemetry.events
            await deliver(sink, later)
            [issue] = server.issues()
            assert issue["state"] == "opened" and sink.telemetry.events["reopened"] == 1
            assert any("### Recurrence" in n["body"] for n in server.notes(issue["iid"]))
        finally:
            await sink.close()


def test_an_incidents_automatic_contract_promises_the_event_its_issue_shows() -> None:
    """What the desk judges is what the issue's contract section says: the fix must start the promised event (the
    MR path's repair emits it), so a signature that merely stops is not FIXED without evidence the fix ran."""
    from sinks.gitlab.body_incident import filed_contract
    from tests.regressions.builders import access, incident

    desk = _desk()
    event = incident(access("1.0", "shop.handlers.capture_payment", "/orders/{id}/capture", at_ms=10, service="shop"),
                     access("1.0", "shop.jobs.expire_cart", "job expire_cart", at_ms=11, service="shop", error=True,
                            exception="OrderChangedConcurrently"), fingerprint="fp-inc")  # fmt: skip
    desk.on_event(event, "p0")
    [made] = desk._new_contracts
    shown = filed_contract(event)
    assert made.must_start == shown.must_start == "trace_repro.fix.fp-inc"
    assert (made.signature, made.watch_s) == (shown.signature, shown.watch_s)
