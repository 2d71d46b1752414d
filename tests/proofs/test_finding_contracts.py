"""A detector's finding gets a proof contract from its rules, and the existing judge decides it on the next build."""

from __future__ import annotations

import pytest

from processors.api.component import Emit
from processors.connectors.proofs.config import ProofConfig
from processors.connectors.proofs.contracts import FindingSignature, finding_signature, parse_signature
from processors.connectors.proofs.desk import ProofDesk
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, verdicts_by_version
from processors.lib.stat_tests import rate_interval, requests_to_show_drop
from processors.model.contract import ProofContract
from processors.model.finding import ContractRules, FindingEvent, FindingType, Subject, register_type
from processors.model.trace import ClosedTrace
from processors.model.units import zero_error_floor
from processors.model.verdict import VerdictEvent
from tests.regressions.builders import MS, SERVICE, T0, S, request

TYPE = "test_pile_up"  # a type only this test registers: the desk must handle it without knowing it
ROUTE = "/split/even"
SIGNATURE = f"finding:{TYPE}:fp-pile"
register_type(FindingType(name=TYPE, title="Test pile-up", description="a finding type of the proof desk's tests"))


def _finding(version: str, at_ns: int, n: int, *, signature: str = SIGNATURE, affected: int = 1) -> FindingEvent:
    return FindingEvent(
        fingerprint="fp-pile", occurrence=f"occ-{version}-{n}", detected_at_unix_ms=at_ns / 1e6, type=TYPE,
        title="requests pile up", subject=Subject(service=SERVICE, operation=f"POST {ROUTE}", version=version),
        first_seen_unix_ms=at_ns / 1e6, contract=ContractRules(signature=signature, routes=[ROUTE], baseline_rate=0.05),
        affected=affected,
    )  # fmt: skip


def _run(v2_requests: int, v2_findings: int, affected: int = 1,
         desk: ProofDesk | None = None) -> tuple[ProofDesk, list[VerdictEvent], list[ProofContract]]:  # fmt: skip
    """Build 1.0 serves 200 requests on the route with a finding on every 20th; build 1.1 (from T0 + 100 s) serves
    ``v2_requests`` with ``v2_findings`` findings; watermarks every 5 s until the 60 s watch of 1.1 has ended."""
    desk = desk or ProofDesk(ProofConfig(settle_s=0, watch_s=60))
    items: list[tuple[int, ClosedTrace | FindingEvent]] = []
    for version, start, n, found in (("1.0", T0, 200, 10), ("1.1", T0 + 100 * S, v2_requests, v2_findings)):
        for j in range(n):
            trace = request(start + j * 100 * MS, version, route=ROUTE)
            items.append((trace.end_ns, trace))
            if j % 20 == 19 and j // 20 < found:
                items.append((trace.end_ns, _finding(version, trace.spans[0].start_ns, j, affected=affected)))
    items.sort(key=lambda item: item[0])
    verdicts: list[VerdictEvent] = []
    contracts: list[ProofContract] = []
    quarantined: list[str] = []
    watermark, i = T0, 0
    while watermark <= T0 + 200 * S:
        while i < len(items) and items[i][0] <= watermark:
            item = items[i][1]
            if isinstance(item, ClosedTrace):
                desk.on_trace(item, [])
            else:
                desk.on_event(item, "incidents/0")
            i += 1
        out = Emit()
        desk.on_watermark(watermark, None, out)
        verdicts += [e for e in out.events if isinstance(e, VerdictEvent)]
        contracts += [r for r in out.graph.records if isinstance(r, ProofContract)]
        quarantined += [q.what for q in out.quarantined]
        watermark += 5 * S
    desk.telemetry.events["test_quarantined"] = len(quarantined)
    return desk, verdicts, contracts


def test_a_finding_gets_one_automatic_contract_from_its_rules() -> None:
    """One contract for the fingerprint (later occurrences are counted, not contracted again): the rules' signature,
    routes and the zero-error floor of their baseline rate, on the build it was seen on."""
    desk, _, contracts = _run(200, 0)
    [c] = contracts
    assert (c.signature, c.fingerprint, c.routes, c.service, c.version) == (SIGNATURE, "fp-pile", [ROUTE], SERVICE,
                                                                             "1.0")  # fmt: skip
    assert c.automatic and c.baseline_rate == 0.05 and c.min_requests == zero_error_floor(0.05, 0.05) == 59
    assert desk.judge.counters["findings"] == 10 and desk.telemetry.events["findings_deduplicated"] == 9


def test_a_build_without_the_finding_is_fixed_with_the_receipts_numbers() -> None:
    """1.1 serves requests on the route and the finding never occurs: FIXED against 10 of 200 on 1.0, at the first
    watermark (every 5 s: 50 requests) after it served the requests the rule needs."""
    _, verdicts, _ = _run(200, 0)
    assert verdicts_by_version(verdicts) == {"1.1": [FIXED]}
    [v] = verdicts
    r = v.receipt
    assert (v.fingerprint, v.contract, v.service) == ("fp-pile", SIGNATURE, SERVICE)
    assert (r.before_errors, r.before_requests, r.after_errors) == (10, 200, 0)
    assert r.floor == zero_error_floor(rate_interval(10, 200)[1], 0.05) and r.requests_needed == 0
    needed = max(r.floor, requests_to_show_drop(10, 200, 0.05 / 2) or 0)
    assert needed <= r.after_requests < needed + 50
    assert r.p_value is not None and r.p_value <= 0.05 / 2 and r.still_happens_at == []


def test_a_build_where_the_finding_recurs_is_not_fixed_and_says_where() -> None:
    """One occurrence of the finding on 1.1 (at its 20th request) is its NOT_FIXED at the next watermark (5 s: its
    first 50 requests), with the site the finding names."""
    _, verdicts, _ = _run(200, 1)
    assert verdicts_by_version(verdicts) == {"1.1": [NOT_FIXED]}
    [v] = verdicts
    assert (v.receipt.after_errors, v.receipt.after_requests) == (1, 50)
    assert v.receipt.still_happens_at == [f"POST {ROUTE}"]


def test_too_little_traffic_on_the_new_build_is_insufficient_with_what_is_missing() -> None:
    """1.1 serves 5 requests in its watch: INSUFFICIENT, with the requests still needed."""
    _, verdicts, _ = _run(5, 0)
    assert verdicts_by_version(verdicts) == {"1.1": [INSUFFICIENT]}
    [v] = verdicts
    r = v.receipt
    assert (r.before_errors, r.before_requests, r.after_errors, r.after_requests) == (10, 200, 0, 5)
    assert r.requests_needed + 5 >= r.floor > 5 and f"{r.requests_needed} more" in v.reason


@pytest.mark.parametrize(
    ("given", "counted"),
    [
        (SIGNATURE, SIGNATURE),  # the documented form
        (f"{TYPE}:fp-pile", SIGNATURE),  # a detector's bare <type>:<fingerprint>
        ("pile", f"finding:{TYPE}:pile"),  # anything else, under the finding's type
        ("error:POST /x:Timeout", "error:POST /x:Timeout"),  # a known form stays what it is
    ],
)
def test_the_signature_a_finding_is_counted_under(given: str, counted: str) -> None:
    """The rules' signature when the judge knows its form, else ``finding:<type>:...``; it parses back."""
    finding = _finding("1.0", T0, 0, signature=given)
    assert finding.contract is not None
    assert finding_signature(finding, finding.contract) == counted
    assert str(parse_signature(counted)) == counted
    assert parse_signature(SIGNATURE) == FindingSignature(TYPE, "fp-pile")
    for bad in ("finding:", f"finding:{TYPE}", "finding::fp"):
        with pytest.raises(ValueError):
            parse_signature(bad)


def test_a_finding_no_contract_can_be_made_for_is_counted_as_dropped_and_the_desk_goes_on() -> None:
    """A finding without a fingerprint gets no contract: counted by reason, nothing raised, the next one contracted."""
    desk = ProofDesk(ProofConfig(settle_s=0))
    desk.on_event(_finding("1.0", T0, 0).model_copy(update={"fingerprint": ""}), "incidents/0")
    assert desk.telemetry.dropped["finding_without_contract"] == 1 and desk._new_contracts == []
    desk.on_event(_finding("1.0", T0, 1), "incidents/0")
    assert [c.signature for c in desk._new_contracts] == [SIGNATURE]


def test_the_signatures_remembered_per_fingerprint_are_bounded_and_the_evictions_counted() -> None:
    """``[proof] max_fingerprints`` bounds what the judge remembers of occurrences (signatures, routes)."""
    desk = ProofDesk(ProofConfig(settle_s=0, max_fingerprints=16))
    for n in range(20):
        finding = _finding("1.0", T0, n).model_copy(update={"fingerprint": f"fp-{n}"})
        desk.judge.on_finding(finding, f"finding:{TYPE}:fp-{n}", [ROUTE])
    assert desk.judge.telemetry.dropped["max_occurrence_keys"] == 2 * 4  # 4 fingerprints and their 4 signatures


def test_a_finding_counts_once_per_request_it_covers() -> None:
    """A window's finding that covers 3 requests (``affected``) is 3 occurrences against the route's requests."""
    _, verdicts, _ = _run(400, 0, affected=3)
    [v] = verdicts
    assert v.outcome == FIXED and (v.receipt.before_errors, v.receipt.before_requests) == (30, 200)


def test_occurrences_beyond_the_counted_requests_are_a_rate_of_at_most_one() -> None:
    """Findings that cover more requests than the route's counted ones (a job's, a route named otherwise) are a rate
    of 1, never more: the judge decides (here FIXED) instead of failing on an impossible rate."""
    _, verdicts, _ = _run(400, 0, affected=50)
    [v] = verdicts
    assert v.outcome == FIXED and v.receipt.before_errors == v.receipt.before_requests == 500


def test_a_contract_whose_judging_fails_is_quarantined_and_the_desk_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A defect in judging one contract is reported as quarantined at each watermark, never raised out of it."""
    desk = ProofDesk(ProofConfig(settle_s=0, watch_s=60))

    def broken(*_: object) -> list[VerdictEvent]:
        raise ValueError("a defect in one contract's rule")

    monkeypatch.setattr(desk.judge.rules, "judge", broken)
    desk, verdicts, contracts = _run(200, 0, desk=desk)
    assert verdicts == [] and len(contracts) == 1
    assert desk.telemetry.events["test_quarantined"] > 0 and desk.judge.telemetry.dropped["contract_failed"] > 0
