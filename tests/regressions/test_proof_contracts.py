"""Proof contracts: signatures, traffic floors, builders from incidents and regressions, graph row."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from processors.connectors.proofs.contracts import (
    CollisionSignature,
    ErrorSignature,
    collision_signature,
    contract_from_incident,
    contract_from_regression,
    min_requests_for,
    parse_signature,
)
from processors.model.contract import DEFAULT_MIN_REQUESTS, ProofContract
from processors.model.regression import Evidence, RegressionEvent
from sinks.graph import schema
from sinks.graph.records import contract_row
from tests.regressions.builders import access, incident, statement_params


def test_error_signatures_parse_with_routes_that_contain_colons() -> None:
    """error:<route>:<exception> splits on the last colon; '*' matches any route; exceptions match by last part."""
    sig = parse_signature("error:POST /v1/bills:split:ZeroDivisionError")
    assert sig == ErrorSignature("POST /v1/bills:split", "ZeroDivisionError")
    wild = parse_signature("error:*:RoundingError")
    assert isinstance(wild, ErrorSignature)
    assert wild.matches_route("POST /split/even", "/split/even") and wild.matches_error("app.errors.RoundingError")
    exact = parse_signature("error:/split/even:RoundingError")
    assert isinstance(exact, ErrorSignature)
    assert exact.matches_route("POST /split/even", "/split/even") and not exact.matches_route("POST /x", "/x")
    assert not exact.matches_error("NotRoundingError")
    for bad in ("error:nothing", "error::X", "lost_update:orders", "plain"):
        with pytest.raises(ValueError):
            parse_signature(bad)


def test_collision_signature_from_an_incident_sorts_its_functions() -> None:
    """Culprit and victim functions, sorted, whichever of them wrote first; one function when both are the same."""
    cap = access("1.0", "shop.handlers.capture_payment", "/orders/{id}/capture", at_ms=1.0)
    job = access("1.0", "shop.jobs.expire_cart", "job expire_cart", at_ms=2.0)
    expected = "lost_update:orders:shop.handlers.capture_payment+shop.jobs.expire_cart"
    assert collision_signature(incident(job, cap)) == collision_signature(incident(cap, job)) == expected
    assert parse_signature(expected) == CollisionSignature(
        "lost_update", "orders", ("shop.handlers.capture_payment", "shop.jobs.expire_cart"))  # fmt: skip
    same = incident(cap, access("1.0", "shop.handlers.capture_payment", "/x", at_ms=3.0))
    assert collision_signature(same) == "lost_update:orders:shop.handlers.capture_payment"


def test_contract_from_an_incident_takes_its_floor_routes_and_reporting_exception() -> None:
    """3 collisions per 100 requests give p0 = 3% and the zero-error floor of 99 requests."""
    cap = access("1.0", "shop.handlers.capture_payment", "/orders/{id}/capture", at_ms=1.0)
    job = access("1.0", "shop.jobs.expire_cart", "job expire_cart", at_ms=2.0, error=True,
                 exception="bench.shop.errors.OrderChangedConcurrently")  # fmt: skip
    c = contract_from_incident(incident(cap, job, fingerprint="fp1"), "order.capture.locked", occurrences=3,
                               requests=100, watch_s=600, issue=7, now_ms=5.0)  # fmt: skip
    assert c.signature == "lost_update:orders:shop.handlers.capture_payment+shop.jobs.expire_cart"
    assert (c.fingerprint, c.must_start, c.min_requests, c.baseline_rate) == ("fp1", "order.capture.locked", 99, 0.03)
    assert (c.service, c.version, c.issue, c.watch_s, c.created_unix_ms) == ("split", "1.0", 7, 600, 5.0)
    assert c.routes == ["/orders/{id}/capture", "job expire_cart"]
    assert c.reports == ["OrderChangedConcurrently"]
    unknown = contract_from_incident(incident(cap, job), "e")
    assert unknown.min_requests == DEFAULT_MIN_REQUESTS == 299 and unknown.baseline_rate is None


def _error_regression(after_rate: float) -> RegressionEvent:
    ev = Evidence(comparison="version", metric="errors", test="t", before_version="0.9", after_version="1.0",
                  before_windows=["w0"], after_window="w1", before_requests=400, before_errors=0,
                  after_requests=400, after_errors=int(after_rate * 400), before_rate=0.0, after_rate=after_rate,
                  before_p50_ms=1, after_p50_ms=1, before_p95_ms=1, after_p95_ms=1, before_samples=1, after_samples=1,
                  statistic=1, effect=None, p_value=0.001, p_adjusted=0.002, ratio_low=1.0,
                  ratio_high=None)  # fmt: skip
    return RegressionEvent(fingerprint="fpr", occurrence="o", service="split", operation="/split/even",
                           signature="error:POST /split/even:RoundingError", metric="errors", version="1.0",
                           previous_version="0.9", commit="abc", window="w1", window_start_unix_ms=0,
                           window_end_unix_ms=1, summary="s", evidence=[ev], critical_path=[],
                           detected_at_unix_ms=1)  # fmt: skip


def test_contract_from_an_error_regression_uses_the_regressed_rate_and_can_widen_to_any_route() -> None:
    """A 5% RoundingError regression gives a 59-request floor; any_route widens the signature to error:*:..."""
    event = _error_regression(0.05)
    c = contract_from_regression(event, "split.rounded")
    assert (c.signature, c.min_requests, c.routes, c.reports) == (
        "error:POST /split/even:RoundingError", 59, ["/split/even"], ["RoundingError"])  # fmt: skip
    wide = contract_from_regression(event, "split.rounded", any_route=True)
    assert wide.signature == "error:*:RoundingError" and wide.routes == []
    other = event.model_copy(update={"metric": "throughput"})
    with pytest.raises(ValueError, match="no contract for a 'throughput' regression"):
        contract_from_regression(other, "x")


def test_contract_validation_json_round_trip_and_graph_row() -> None:
    """Contracts are strict versioned JSON; the row feeds every parameter of schema.RECORDS["contract"]."""
    c = ProofContract(signature="error:*:RoundingError", fingerprint="fp", must_start="split.rounded")
    assert (c.schema_version, c.kind, c.min_requests) == (1, "contract", 299)
    assert ProofContract.model_validate_json(c.model_dump_json()) == c
    with pytest.raises(ValidationError):
        ProofContract(signature="x", fingerprint="fp", must_start="split.rounded")
    assert ProofContract(signature="error:*:X", fingerprint="fp").must_start == ""  # no event promised
    with pytest.raises(ValidationError):
        ProofContract.model_validate({**c.model_dump(), "surprise": 1})
    assert statement_params(schema.RECORDS["contract"]) <= set(contract_row(c))
    assert min_requests_for(None) == min_requests_for(0.0) == 299 and min_requests_for(0.5) == 5
