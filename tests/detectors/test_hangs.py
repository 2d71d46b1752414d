"""The hang detector: hung calls and unanswered timeouts per hop, planted in route traffic, with their controls."""

from __future__ import annotations

from processors.api.component import Emit
from processors.detectors.hangs import HangConfig, HangData, HangDetector, hang_fingerprint
from processors.model.finding import FindingEvent, data_of
from processors.state.config import WindowConfig
from tests.detectors.run import findings
from tests.detectors.traffic import Hop, assemble, route_traffic

PER_WINDOW = 320
HOP = ("shop", "/checkout", "inventory")


def detector() -> HangDetector:
    return HangDetector(HangConfig(), WindowConfig())


def test_calls_hung_30s_without_an_error_are_a_hang_with_no_timeout() -> None:
    """20 of the fourth window's calls to inventory take 30 s and end without an error: one ``hang`` finding on the
    hop, with its distribution, the threshold, the durations, no timeout seen, and the remedy ``add_timeout``."""
    hung = [(4 * PER_WINDOW - 20 + i, Hop(30_000.0)) for i in range(20)]
    [event] = findings(detector(), route_traffic(5, PER_WINDOW, odd=hung, seed=3))
    data = data_of(event, HangData)
    assert (event.type, event.remedy, event.severity) == ("hang", "add_timeout", "high")
    assert (data.service, data.operation, data.callee) == HOP
    assert (data.hung, data.timeouts, data.timeout_seen, data.calls) == (20, 0, False, PER_WINDOW)
    assert data.baseline_p99_ms < 30 and data.threshold_ms == 5_000.0  # the floor: 10 x p99 is below it
    assert len(data.hung_ms) == 20 and all(ms >= 30_000 for ms in data.hung_ms)
    assert event.fingerprint == hang_fingerprint(HOP)
    assert event.contract is not None and event.contract.signature == f"finding:hang:{event.fingerprint}"
    assert (event.contract.service, event.contract.routes) == ("shop", ["/checkout"])
    assert (event.subject.service, event.subject.operation, event.subject.entity) == HOP
    assert len(event.traces) == 20 and len(event.series[0].points) == 20
    assert "20 of 320 calls from shop /checkout to inventory" in event.evidence[0]
    assert FindingEvent.model_validate_json(event.model_dump_json()) == event


def test_timeouts_the_callee_never_answered_are_a_hang_to_propagate_the_deadline() -> None:
    """12 calls fail with a client ReadTimeout after 5 s and inventory never exported a server span: the hop (its
    callee learned from answered calls) is a ``hang`` finding whose remedy is ``propagate_deadline``."""
    timeouts = [(4 * PER_WINDOW - 40 + 3 * i, Hop(5_000.0, error="ReadTimeout", answered=False)) for i in range(12)]
    [event] = findings(detector(), route_traffic(5, PER_WINDOW, odd=timeouts, seed=4))
    data = data_of(event, HangData)
    assert (data.service, data.operation, data.callee) == HOP
    assert (data.hung, data.timeouts, data.timeout_seen) == (0, 12, True)
    assert event.remedy == "propagate_deadline" and "never answered" in event.title


def test_controls_stay_silent() -> None:
    """The same traffic with no hang, with slow calls under the floor, with answered timeouts and with failures
    that are not timeouts: no finding."""
    slow = [(4 * PER_WINDOW - 20 + i, Hop(2_000.0)) for i in range(20)]  # 100 x the p99, under the 5 s floor
    answered = [(4 * PER_WINDOW - 40 + 3 * i, Hop(5_000.0, error="ReadTimeout")) for i in range(12)]
    refused = [(4 * PER_WINDOW - 40 + 3 * i, Hop(3.0, error="ConnectionRefused", answered=False)) for i in range(12)]
    for odd in ([], slow, answered, refused):
        assert findings(detector(), route_traffic(5, PER_WINDOW, odd=odd, seed=5)) == []


def test_a_hang_before_the_hop_has_a_distribution_is_not_judged() -> None:
    """Hung calls in the first window, before ``min_baseline`` recent calls: nothing to judge them by, no finding."""
    hung = [(PER_WINDOW - 20 + i, Hop(30_000.0)) for i in range(20)]
    assert findings(detector(), route_traffic(2, PER_WINDOW, odd=hung, seed=6)) == []


def test_a_backlog_read_in_one_batch_finds_the_same_hang() -> None:
    """A daemon catching up (or a busy one) reads the hop's first windows and its hung calls in one batch: every
    trace closes before any window does, so no distribution exists yet when the hung calls' traces close. They are
    judged when their window closes, against the windows before it: the same hang as read message by message."""
    hung = [(4 * PER_WINDOW - 20 + i, Hop(30_000.0)) for i in range(20)]
    spans = route_traffic(5, PER_WINDOW, odd=hung, seed=3)
    [live] = findings(detector(), spans)
    backlog, out = detector(), Emit()
    steps = list(assemble(spans))
    for _, traces, _ in steps:
        for trace in traces:
            backlog.on_trace(trace, ())
    backlog.on_watermark(steps[-1][0], None, out)
    [event] = out.events
    assert isinstance(event, FindingEvent) and event.fingerprint == live.fingerprint
    assert data_of(event, HangData).hung == data_of(live, HangData).hung == 20
    assert sorted(event.traces) == sorted(live.traces)


def test_the_hang_fingerprint_is_the_one_issues_were_filed_under() -> None:
    """Fingerprints are persisted (GitLab issues are matched by them): a hop's must not change with a refactor."""
    assert hang_fingerprint(HOP) == "37ba8b1a3f63c122"
