"""The regression detector under sampling: sides kept with different probabilities, or a mix, are not tested."""

from __future__ import annotations

from processors.detectors.regressions.detector import RegressionDetector
from processors.detectors.regressions.shares import Share, shares
from processors.model.sampling import Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from tests.regressions.test_regression_detector import traffic, windows

ALL = Sampling(1.0, "tracestate")
HALF = Sampling(0.5, "tracestate")


def _kept(traces: list[ClosedTrace], sampling: Sampling, errors: Sampling | None = None) -> list[ClosedTrace]:
    def one(t: ClosedTrace) -> ClosedTrace:
        s = errors if errors is not None and any(x.is_error for x in t.spans) else sampling
        return ClosedTrace(t.trace_id, tuple(Span(*x.__reduce__()[1][:-1], s) for x in t.spans))

    return [one(t) for t in traces]


def _regressions(
    before: Sampling | None, after: Sampling | None, errors: Sampling | None = None
) -> tuple[int, list[str]]:
    """0.9: 400 clean requests; 1.0: 12 of 400 fail (the unsampled detector flags it)."""
    old = traffic(0, "0.9", 400)
    new = traffic(1, "1.0", 400, errors=12, exception="RoundingError", seed=1)
    if before is not None and after is not None:
        old, new = _kept(old, before), _kept(new, after, errors)
    w0, w1 = windows(old, new)
    detector = RegressionDetector()
    detector.on_window(w0)
    found = detector.on_window(w1)
    return len(found.regressions), [i.reason for i in found.insufficient if i.metric == "sampling"]


def test_unsampled_or_equally_sampled_the_regression_is_found() -> None:
    assert _regressions(None, None) == (1, [])
    assert _regressions(HALF, HALF) == (1, [])


def test_different_sampling_between_versions_is_insufficient_with_the_reason() -> None:
    """0.9 kept at 1, 1.0 at 0.5: no regression event; the version comparison reports why it was not tested."""
    n, reasons = _regressions(ALL, HALF)
    assert n == 0
    assert any(r.startswith("sampling differs: 1 in the version (0.9), 0.5 in 1.0 now") for r in reasons), reasons


def test_error_keeping_tail_sampling_is_insufficient() -> None:
    """Both versions kept at 0.5 but every failed trace at 1: 1.0's mix of probabilities is named."""
    n, reasons = _regressions(HALF, HALF, errors=ALL)
    assert n == 0
    assert any(r.startswith("sampling is not uniform in 1.0 now: mixed: 0.5 (388 requests), 1 (12 requests)")
               for r in reasons), reasons  # fmt: skip


def test_a_share_carries_the_sampling_counts_to_stage_2() -> None:
    [w] = windows(_kept(traffic(0, "0.9", 40), HALF))
    [relay] = shares(w)
    assert Share.model_validate(relay.body).op(8).sampled == {"0.5": 40}
    old = dict(relay.body)
    del old["sampled"]  # a share relayed by a daemon that did not read sampling still decodes
    assert Share.model_validate(old).op(8).sampled == {}
