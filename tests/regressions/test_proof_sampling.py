"""The proof judge under sampling: builds kept with different probabilities, or a mix of them, get INSUFFICIENT
with the reason, where the same telemetry unsampled gets its usual FIXED or WORSE; receipts say the sampling."""

from __future__ import annotations

from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE, verdicts_by_version
from processors.model.outputs import VerdictEvent
from processors.model.sampling import Sampling
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from tests.regressions.builders import T0, S
from tests.regressions.test_proof_judge import CONTRACT, Feed, Item, build
from tests.regressions.test_regression_contracts import _contract as latency_contract
from tests.regressions.test_regression_contracts import _traffic as latency_traffic


def _kept_with(span: Span, sampling: Sampling) -> Span:
    return Span(*span.__reduce__()[1][:-1], sampling)


class SampledFeed(Feed):
    """A feed whose traces of each version carry that version's sampling (``errors``: the sampling of failed
    traces instead, as an error-keeping tail sampler that states its probabilities gives)."""

    def __init__(self, judge: ProofJudge, by_version: dict[str, Sampling], errors: Sampling | None = None) -> None:
        super().__init__(judge)
        self.by_version, self.errors = by_version, errors

    def add(self, at_ns: int, item: Item) -> None:
        if isinstance(item, ClosedTrace) and item.spans[0].resource.version in self.by_version:
            failed = any(s.is_error for s in item.spans)
            sampling = self.errors if failed and self.errors else self.by_version[item.spans[0].resource.version]
            item = ClosedTrace(item.trace_id, tuple(_kept_with(s, sampling) for s in item.spans))
        super().add(at_ns, item)


def _fix(by_version: dict[str, Sampling]) -> list[VerdictEvent]:
    """1.0 fails one request in twenty with the contract's RoundingError; 1.1 fixes it (and logs the must-start)."""
    judge = ProofJudge()
    judge.on_contract(CONTRACT)
    feed = SampledFeed(judge, by_version)
    build(feed, "1.0", T0, 200, buggy=("even", "custom"))
    build(feed, "1.1", T0 + 100 * S, 200, fixed=("even", "custom"))
    return feed.run(T0, T0 + 200 * S)


def _rollback(by_version: dict[str, Sampling], errors: Sampling | None = None) -> list[VerdictEvent]:
    """1.0 fixes the contract's error, 1.1 breaks /split/custom (KeyError every fifth request)."""
    judge = ProofJudge()
    judge.on_contract(CONTRACT.model_copy(update={"version": "0.9"}))
    feed = SampledFeed(judge, by_version, errors)
    build(feed, "0.9", T0, 200, buggy=("even", "custom"))
    build(feed, "1.0", T0 + 100 * S, 200, fixed=("even", "custom"))
    build(feed, "1.1", T0 + 200 * S, 200, fixed=("even", "custom"), broken=("custom",))
    return feed.run(T0, T0 + 300 * S)


HEAD_10 = Sampling(0.1, "tracestate")
HALF = Sampling(0.5, "tracestate")
ALL = Sampling(1.0, "tracestate")


def test_unsampled_the_fix_is_fixed() -> None:
    """The reference: the same telemetry with no sampling information gets FIXED, its receipt saying ``unknown``."""
    [v] = _fix({})
    assert v.outcome == FIXED
    assert v.receipt.sampling == {"1.0": "unknown", "1.1": "unknown"}


def test_a_fix_judged_across_different_sampling_is_insufficient_with_the_reason() -> None:
    """1.0 kept at 0.1, 1.1 at 1: the drop of the error rate cannot be measured; INSUFFICIENT names the sampling."""
    verdicts = _fix({"1.0": HEAD_10, "1.1": ALL})
    assert verdicts_by_version(verdicts) == {"1.1": [INSUFFICIENT]}
    [v] = verdicts
    assert v.reason.startswith("sampling differs: 0.1 on 1.0, 1 on 1.1")
    assert "so no FIXED" in v.reason and not v.rollback
    assert v.receipt.sampling == {"1.0": "0.1", "1.1": "1"}


def test_the_same_sampling_on_both_builds_keeps_the_verdict() -> None:
    """Both builds kept at 0.1: the rates are comparable, the verdict stands."""
    [v] = _fix({"1.0": HEAD_10, "1.1": HEAD_10})
    assert v.outcome == FIXED
    assert v.receipt.sampling == {"1.0": "0.1", "1.1": "0.1"}


def test_error_biased_sampling_makes_a_rollback_insufficient() -> None:
    """Unsampled, 1.1 is WORSE; kept at 0.1 but every failed trace at 1 (tail sampling keeping errors), the mix of
    probabilities is reported, with the requests and errors at each, instead of a rollback."""
    assert verdicts_by_version(_rollback({})) == {"1.0": [FIXED], "1.1": [FIXED, WORSE]}
    every = {"0.9": HEAD_10, "1.0": HEAD_10, "1.1": HEAD_10}
    verdicts = _rollback(every, errors=ALL)
    assert [v.outcome for v in verdicts if v.version == "1.1"] == [INSUFFICIENT]
    [v] = [v for v in verdicts if v.version == "1.1"]
    assert v.reason.startswith("sampling is not uniform on ")
    assert "1 (" in v.reason and "0.1 (" in v.reason and " errors)" in v.reason
    assert "so no FIXED" in v.reason and not v.rollback  # the first look's FIXED; the WORSE after it, dropped
    assert verdicts_by_version(verdicts)["1.0"] == [INSUFFICIENT]  # 0.9's errors were kept at 1 too


def _latency(by_version: dict[str, Sampling], new: tuple[int, int]) -> list[VerdictEvent]:
    """test_regression_contracts' latency contract: 1.0 (baseline, 10/200 slow), 2.0 (regressed, 150/200), 2.1."""
    judge = ProofJudge()
    judge.on_contract(latency_contract())
    feed = SampledFeed(judge, by_version)
    feed.tick_ns = 5 * S
    latency_traffic(feed, "1.0", T0, 200, 10)
    latency_traffic(feed, "2.0", T0 + 20 * S, 200, 150)
    latency_traffic(feed, "2.1", T0 + 40 * S, new[1], new[0])
    return feed.run(T0, T0 + 200 * S)


def test_a_latency_verdict_across_different_sampling_is_insufficient_even_not_fixed() -> None:
    """A latency NOT_FIXED is a comparison of shares too: 2.1 kept at 0.5 against builds kept at 1 is INSUFFICIENT."""
    assert [v.outcome for v in _latency({}, (100, 200))] == [NOT_FIXED]
    [v] = _latency({"1.0": ALL, "2.0": ALL, "2.1": HALF}, (100, 200))
    assert v.outcome == INSUFFICIENT and "so no NOT_FIXED" in v.reason
    assert v.reason.startswith("sampling differs: 1 on ") and "0.5 on 2.1" in v.reason
    assert v.receipt.sampling == {"1.0": "1", "2.0": "1", "2.1": "0.5"}
