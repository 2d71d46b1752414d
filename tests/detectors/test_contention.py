"""The contention detector: latency against in-flight concurrency, planted behind one lock, with its controls."""

from __future__ import annotations

from processors.detectors.contention import ContentionConfig, ContentionData, ContentionDetector, contention_fingerprint
from processors.model.finding import FindingEvent, data_of
from processors.state.config import WindowConfig
from tests.detectors.run import findings
from tests.detectors.traffic import load_traffic

RATES = (3.0, 20.0, 3.0, 25.0)


def detector() -> ContentionDetector:
    return ContentionDetector(ContentionConfig(), WindowConfig())


def test_requests_queueing_for_one_lock_are_contention_with_the_fitted_slope() -> None:
    """POST /pay's 30 ms critical sections queue for one lock: at 20-25 requests/s latency grows with the requests
    in flight. A ``contention`` finding names the test and its numbers, the Theil-Sen slope and the chart."""
    found = findings(detector(), load_traffic(RATES, seed=1))
    assert found, "no contention found"
    event = found[-1]
    data = data_of(event, ContentionData)
    assert (event.type, event.remedy) == ("contention", "reduce_lock_scope")
    assert (data.service, data.operation) == ("payments", "/pay")
    assert data.rho >= 0.4 and data.p_value < 1e-4 and data.slope_low > 0 and data.ratio >= 1.5
    assert data.windows >= 2 and data.pairs >= 200 and "Spearman" in data.test
    assert event.fingerprint == contention_fingerprint(("payments", "/pay"))
    assert event.contract is not None and event.contract.signature == f"finding:contention:{event.fingerprint}"
    assert event.contract.routes == ["/pay"]
    assert event.series[0].x_label == "requests in flight at start" and len(event.series[0].points) >= 3
    assert f"rho = {data.rho:.3f}" in event.evidence[0]
    assert {e.fingerprint for e in found} == {event.fingerprint}  # one issue, an occurrence per window
    assert FindingEvent.model_validate_json(event.model_dump_json()) == event


def test_controls_stay_silent() -> None:
    """The same arrivals without the lock, and a slower build (three times the latency at the higher rates, so
    more in flight, with no lock): no finding."""
    assert findings(detector(), load_traffic(RATES, lock=False, seed=2)) == []
    assert findings(detector(), load_traffic(RATES, lock=False, slower=(1, 3, 1, 3), seed=3)) == []


def test_the_contention_fingerprint_is_the_one_issues_were_filed_under() -> None:
    """Fingerprints are persisted (GitLab issues are matched by them): one must not change in a refactor."""
    assert contention_fingerprint(("payments", "/pay")) == "633e3ad69fa6e636"
