"""The proof judge on hand-built telemetry in event time: FIXED, NOT_FIXED, WORSE, INSUFFICIENT, per build."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

import pytest

from processors.connectors.proofs.contracts import contract_from_incident
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE, verdicts_by_version
from processors.model.contract import ProofContract
from processors.model.events import LogRecord, SpanKind, StatusCode
from processors.model.outputs import IncidentEvent, VerdictEvent
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from sinks.graph import schema
from sinks.graph.records import verdict_row
from tests.regressions.builders import MS, T0, S, access, incident, log, request, resource, statement_params

Item = ClosedTrace | LogRecord | IncidentEvent
EVENT = "split.rounded"
CONTRACT = ProofContract(signature="error:*:RoundingError", fingerprint="fp-round", must_start=EVENT, watch_s=60,
                         min_requests=59, baseline_rate=0.05, service="split", version="1.0")  # fmt: skip


@dataclass
class Feed:
    """Input handed to the judge in event-time order, with ``close_until`` every ``tick`` of event time."""

    judge: ProofJudge
    tick_ns: int = 5 * S
    items: list[tuple[int, int, Item]] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def add(self, at_ns: int, item: Item) -> None:
        heapq.heappush(self.items, (at_ns, next(self._seq), item))

    def run(self, start_ns: int, until_ns: int) -> list[VerdictEvent]:
        out: list[VerdictEvent] = []
        watermark = start_ns
        while watermark <= until_ns:
            while self.items and self.items[0][0] <= watermark:
                _, _, item = heapq.heappop(self.items)
                if isinstance(item, ClosedTrace):
                    self.judge.on_trace(item)
                elif isinstance(item, LogRecord):
                    self.judge.on_log(item)
                else:
                    self.judge.on_incident(item)
            out += self.judge.close_until(watermark)
            watermark += self.tick_ns
        return out


def build(feed: Feed, version: str, start_ns: int, n: int, *, buggy: tuple[str, ...] = (),
          fixed: tuple[str, ...] = (), broken: tuple[str, ...] = ()) -> None:  # fmt: skip
    """``n`` requests, every 100 ms, alternating /split/even and /split/custom.

    Every 10th request of a ``buggy`` route fails with RoundingError; every 5th of a ``broken`` one with KeyError;
    every 5th of a ``fixed`` one logs the must-start event.
    """
    for j in range(n):
        route = "/split/even" if j % 2 == 0 else "/split/custom"
        name = route.rsplit("/", 1)[-1]
        at = start_ns + j * 100 * MS
        k = j // 2
        exception = ""
        if name in buggy and k % 10 == 9:
            exception = "RoundingError"
        elif name in broken and k % 5 == 4:
            exception = "KeyError"
        trace = request(at, version, route=route, exception=exception)
        feed.add(trace.end_ns, trace)
        if name in fixed and k % 5 == 0:
            feed.add(at + MS, log(at + MS, version, EVENT))


def scenario(*, late_old_traffic: bool = True) -> list[VerdictEvent]:
    """1.0 buggy on both routes, 1.1 fixes one, 1.2 both, 1.3 fixes both but breaks /split/custom, 1.4 barely runs."""
    judge = ProofJudge()
    judge.on_contract(CONTRACT)
    feed = Feed(judge)
    both = ("even", "custom")
    build(feed, "1.0", T0, 200, buggy=both)
    build(feed, "1.1", T0 + 100 * S, 200, buggy=("custom",), fixed=("even",))
    build(feed, "1.2", T0 + 200 * S, 200, fixed=both)
    if late_old_traffic:  # a draining 1.0 pod keeps failing during 1.2's rollout
        for j in range(10):
            trace = request(T0 + 210 * S + j * MS, "1.0", route="/split/custom", exception="RoundingError")
            feed.add(trace.end_ns, trace)
    build(feed, "1.3", T0 + 300 * S, 200, fixed=both, broken=("custom",))
    build(feed, "1.4", T0 + 400 * S, 20, fixed=both)
    return feed.run(T0, T0 + 500 * S)


@pytest.fixture(scope="module")
def verdicts() -> list[VerdictEvent]:
    return scenario()


def _one(verdicts: list[VerdictEvent], version: str) -> VerdictEvent:
    [v] = [v for v in verdicts if v.version == version]
    return v


def test_each_new_build_gets_exactly_its_verdict(verdicts: list[VerdictEvent]) -> None:
    """1.1 NOT_FIXED, 1.2 FIXED, 1.3 WORSE, 1.4 INSUFFICIENT; the buggy 1.0 itself is not judged."""
    assert verdicts_by_version(verdicts) == {"1.1": [NOT_FIXED], "1.2": [FIXED], "1.3": [WORSE], "1.4": [INSUFFICIENT]}
    assert all(v.fingerprint == "fp-round" and v.contract == "error:*:RoundingError" for v in verdicts)
    assert all(v.commit == f"rev-{v.version}" and v.service == "split" for v in verdicts)


def test_a_fix_covering_one_route_is_not_fixed_and_names_the_other_route(verdicts: list[VerdictEvent]) -> None:
    """1.1 fixed /split/even only: NOT_FIXED as soon as RoundingError shows on /split/custom, and only there."""
    v = _one(verdicts, "1.1")
    assert v.receipt.still_happens_at == ["POST /split/custom in split.handlers.custom"]
    assert "/split/even" not in v.reason and "POST /split/custom" in v.reason
    assert v.receipt.after_errors == 2 and v.receipt.after_requests == 50  # the first 5 s of 1.1
    assert v.receipt.must_start_seen >= 1  # the must-start event alone proves nothing
    assert not v.rollback


def test_the_complete_fix_is_fixed_with_a_receipt(verdicts: list[VerdictEvent]) -> None:
    """1.2: 0 RoundingError in 100 requests >= the 59 floor, must-start seen; before is 1.1 (10 in 200)."""
    r = _one(verdicts, "1.2").receipt
    assert (r.after_errors, r.after_requests, r.before_errors, r.before_requests) == (0, 100, 10, 200)
    assert r.must_start_seen == 20 and r.requests_needed == 0 and r.still_happens_at == []
    assert r.p_value == pytest.approx((200 / 300) ** 10)  # exact conditional binomial, rate dropped
    assert r.interval is not None and CONTRACT.baseline_rate is not None
    assert r.interval[0] == 0.0 and r.interval[1] < CONTRACT.baseline_rate
    # From the build's first request to the last one counted (the watermark was at 210 s).
    assert (r.window_start_unix_ms, r.window_end_unix_ms) == ((T0 + 200 * S) / 1e6, (T0 + 209_900 * MS) / 1e6)


def test_a_build_that_fixes_the_bug_but_fails_elsewhere_is_worse_with_rollback(verdicts: list[VerdictEvent]) -> None:
    """1.3: RoundingError is gone but KeyError on /split/custom makes it worse than 1.2 overall: roll back."""
    v = _one(verdicts, "1.3")
    assert v.rollback
    r = v.receipt
    assert (r.before_errors, r.before_requests, r.after_errors, r.after_requests) == (0, 200, 10, 100)
    assert r.p_value is not None and r.p_value == pytest.approx((100 / 300) ** 10)
    assert r.p_value <= CONTRACT.alpha / 2
    assert "signature is gone" in v.reason and "POST /split/custom: KeyError" in v.reason


def test_a_build_with_too_little_traffic_is_insufficient_with_the_requests_still_needed(
    verdicts: list[VerdictEvent],
) -> None:
    """1.4 served 20 requests in its 60 s watch: INSUFFICIENT. Against 10 in 200 before (1.1), a drop is significant
    at 0.025 after 200 * (0.025 ** -0.1 - 1) = 89.2 clean requests, above the floor of 32 from the before rate's
    exact upper bound 0.0896: 70 more needed."""
    v = _one(verdicts, "1.4")
    assert v.receipt.after_requests == 20 and v.receipt.requests_needed == 70 and v.receipt.floor == 32
    assert "70 more" in v.reason


def test_late_old_version_telemetry_does_not_count_against_the_new_build() -> None:
    """1.0 failures timestamped inside 1.2's rollout count for 1.0: the verdicts are the same without them."""
    with_late = scenario(late_old_traffic=True)
    without = scenario(late_old_traffic=False)
    assert with_late == without


def test_no_verdict_mixes_versions(verdicts: list[VerdictEvent]) -> None:
    """Every receipt's after side is that build's own traffic: never more requests than it served."""
    served = {"1.1": 200, "1.2": 200, "1.3": 200, "1.4": 20}
    for v in verdicts:
        assert v.receipt.after_requests <= served[v.version]
        assert v.version in v.reason or v.outcome == FIXED


def test_fixed_needs_the_must_start_event_or_ends_insufficient() -> None:
    """Enough clean traffic without the must-start event is no proof: INSUFFICIENT when the watch ends."""
    judge = ProofJudge()
    judge.on_contract(CONTRACT)
    feed = Feed(judge)
    build(feed, "1.0", T0, 100, buggy=("even", "custom"))
    build(feed, "2.0", T0 + 100 * S, 200)
    [v] = feed.run(T0, T0 + 200 * S)
    assert (v.version, v.outcome, v.receipt.requests_needed) == ("2.0", INSUFFICIENT, 0)
    assert "never was" in v.reason


def test_an_unbound_contract_binds_to_the_first_build_showing_its_signature() -> None:
    """Without service and version, the contract watches where RoundingError first showed (split 1.0)."""
    judge = ProofJudge()
    judge.on_contract(CONTRACT.model_copy(update={"service": "", "version": ""}))
    feed = Feed(judge)
    other = request(T0, "9.9", service="ledger")
    feed.add(other.end_ns, other)
    build(feed, "1.0", T0, 100, buggy=("even", "custom"))
    build(feed, "1.2", T0 + 100 * S, 100, fixed=("even", "custom"))
    assert verdicts_by_version(feed.run(T0, T0 + 200 * S)) == {"1.2": [FIXED]}


# ---- collisions ----------------------------------------------------------------------------------------------

CAPTURE = ("shop.handlers.capture_payment", "/orders/{id}/capture")
EXPIRE = ("shop.jobs.expire_cart", "job expire_cart")
LOCKED = "order.capture.locked"


def _capture(at_ns: int, version: str, *, must_start_span: bool = False) -> ClosedTrace:
    """A capture request; with ``must_start_span`` its handler has a child span named after the must-start event."""
    trace = request(at_ns, version, route=CAPTURE[1], function=CAPTURE[0], service="shop")
    if not must_start_span:
        return trace
    handler = trace.spans[1]
    mark = Span(trace.trace_id, handler.span_id[:-4] + "00ff", handler.span_id, LOCKED, SpanKind.INTERNAL,
                at_ns + 2 * MS, at_ns + 3 * MS, StatusCode.UNSET, resource(version, "shop"))  # fmt: skip
    return ClosedTrace(trace.trace_id, (*trace.spans, mark))


def _collision(at_ns: int, culprit_version: str, victim_version: str) -> IncidentEvent:
    at_ms = at_ns / 1e6
    return incident(access(culprit_version, *CAPTURE, at_ms=at_ms, service="shop"),
                    access(victim_version, *EXPIRE, at_ms=at_ms + 1, service="shop", error=True,
                           exception="OrderChangedConcurrently"))  # fmt: skip


def collisions(settle_ns: int) -> tuple[list[VerdictEvent], ProofJudge]:
    """1.0 collides 10 times in 30 requests; 1.1 collides only with a draining 1.0 job; 1.2 collides with itself,
    reported 3 s late.

    Against 10 in 30 before, 14 clean requests make a drop significant at alpha/2 (30 * (0.025 ** -0.1 - 1) = 13.4),
    above the floor of 4 from the before rate's upper bound. 1.2's collision happens 500 ms into its rollout (5
    requests), before that, and is found 3 s later.
    """
    first = _collision(T0 + S, "1.0", "1.0")
    judge = ProofJudge(settle_ns=settle_ns)
    judge.on_contract(contract_from_incident(first, LOCKED, watch_s=60).model_copy(update={"min_requests": 20}))
    feed = Feed(judge, tick_ns=S)
    for j in range(30):
        for version, start in (("1.0", T0), ("1.1", T0 + 100 * S), ("1.2", T0 + 200 * S)):
            trace = _capture(start + j * 100 * MS, version, must_start_span=version != "1.0")
            feed.add(trace.end_ns, trace)
    feed.add(T0 + 2 * S, first)
    for j in range(1, 10):
        feed.add(T0 + 2 * S + j * 100 * MS, _collision(T0 + S + j * 200 * MS, "1.0", "1.0"))
    feed.add(T0 + 102 * S, _collision(T0 + 101 * S, "1.1", "1.0"))  # mixed: counts for neither build
    feed.add(T0 + 203_500 * MS, _collision(T0 + 200_500 * MS, "1.2", "1.2"))  # found downstream 3 s later
    return feed.run(T0, T0 + 300 * S), judge


def test_collision_contract_mixed_versions_do_not_count_and_settling_waits_for_late_incidents() -> None:
    """1.1 FIXED (its only collision involved a 1.0 job); 1.2 NOT_FIXED naming both functions, never FIXED first."""
    verdicts, judge = collisions(settle_ns=5 * S)
    assert verdicts_by_version(verdicts) == {"1.1": [FIXED], "1.2": [NOT_FIXED]}
    fixed = _one(verdicts, "1.1")
    assert fixed.contract == "lost_update:orders:shop.handlers.capture_payment+shop.jobs.expire_cart"
    assert fixed.receipt.must_start_seen >= 1  # spans named after the event count
    assert (fixed.receipt.before_errors, fixed.receipt.before_requests) == (10, 30)
    assert fixed.receipt.after_errors == 0 and fixed.receipt.after_requests >= 14
    assert fixed.receipt.p_value is not None and fixed.receipt.p_value <= fixed.receipt.alpha / 2
    assert fixed.receipt.floor == 4
    assert judge.counters["mixed_incidents"] == 1
    [where] = _one(verdicts, "1.2").receipt.still_happens_at
    assert where == ("shop.handlers.capture_payment (/orders/{id}/capture) vs "
                     "shop.jobs.expire_cart (job expire_cart) on orders")  # fmt: skip


def test_without_settling_a_late_collision_supersedes_an_early_fixed() -> None:
    """With no settle time the judge says FIXED before the collision arrives, then NOT_FIXED when it does."""
    verdicts, _ = collisions(settle_ns=0)
    assert verdicts_by_version(verdicts)["1.2"] == [FIXED, NOT_FIXED]


def test_verdict_rows_feed_every_parameter_of_the_statement(verdicts: list[VerdictEvent]) -> None:
    """One Verdict node per (contract, build, outcome), linked to its Contract."""
    rows = [verdict_row(v) for v in verdicts]
    assert all(statement_params(schema.RECORDS["verdict"]) <= set(r) for r in rows)
    assert len({r["key"] for r in rows}) == len(rows)
