"""The judge's decision on one build, as a value: the outcome, which rule decided it and the numbers it decided on.

The judge (:mod:`~processors.connectors.proofs.judge`, :mod:`~processors.connectors.proofs.latency`) returns
:class:`Decision` values and writes no prose; :mod:`~processors.connectors.proofs.render` turns a decision into the
verdict's reason, and :func:`~processors.connectors.proofs.verdicts.verdict` into the published event. The sampling
gate (:mod:`~processors.connectors.proofs.sampling`) changes a decision (``sampling``, ``unweighted``), not a text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from processors.connectors.proofs.tallies import Bound, Build, Matched
from processors.model.verdict import Receipt


class Rule(StrEnum):
    """Which rule decided: one per way a verdict is reached."""

    WORSE = "worse"  # the build's total error rate is significantly above the previous build's: roll back
    RECURS = "recurs"  # the signature occurred on the build
    MOVED = "moved"  # gone from its route, but the same error grew on other routes
    DROPPED = "dropped"  # not seen in enough requests, the drop from the before rate significant
    NEVER_SEEN = "never_seen"  # never counted on an earlier build: nothing to show a drop from
    NO_MUST_START = "no_must_start"  # enough requests without it, but the promised event never seen
    SHORT = "short"  # the watch ended before enough requests
    STILL_SLOW = "still_slow"  # latency: the share over the threshold is above the baseline build's
    BACK_TO_NORMAL = "back_to_normal"  # latency: the share dropped significantly from the regressed build's
    NOTHING_TO_DROP = "nothing_to_drop"  # latency: the regressed build's share is not above the baseline's
    SHORT_SLOW = "short_slow"  # latency: the watch ended without a significant test


@dataclass(frozen=True, slots=True)
class Decision:
    """One verdict before it is written: ``after`` is the judged build's count on the rule's measure (occurrences,
    failed or slow requests) over its requests, ``before`` the earlier build's it is compared with (None: none)."""

    outcome: str  # FIXED | NOT_FIXED | WORSE | INSUFFICIENT
    rule: Rule
    signature: str
    service: str
    version: str  # the judged build
    after: Matched
    receipt: Receipt  # the numbers, as published
    before: Matched | None = None
    before_version: str = ""  # the build ``before`` counts (the previous one for WORSE, the regressed one for latency)
    alpha: float = 0.05
    looks: int = 2
    floor: int = 0
    needed: int = 0  # the requests the rule needs on the build
    p_value: float | None = None  # the rule's test (after < before; WORSE: after > before)
    must_start: str = ""
    must_seen: int = 0
    watch_s: float = 0.0
    moved: tuple[str, ...] = ()  # MOVED: where the error now happens
    new_errors: tuple[str, ...] = ()  # WORSE: error sites whose rate went up
    signature_seen: bool = False  # WORSE: the contract's signature still occurs on the build
    threshold_ms: float = 0.0  # latency
    baseline: Matched | None = None  # latency: the baseline build's counts (None: not seen)
    baseline_version: str = ""
    baseline_share: float = 0.0  # latency: the share a drop is tested against when planning
    p_still: float | None = None  # latency: the test of "still slower than the baseline"
    sampling: str = ""  # why the builds' rates cannot be compared ("" when they can)
    unweighted: str = ""  # the outcome the rule gave before the sampling gate made it INSUFFICIENT


def decided(bound: Bound, build: Build, outcome: str, rule: Rule, after: Matched, receipt: Receipt,
            **numbers: Any) -> Decision:  # fmt: skip
    """A decision on ``build`` under ``bound``'s contract: the contract's and the build's parts filled in."""
    c = bound.contract
    return Decision(outcome=outcome, rule=rule, signature=str(bound.signature), service=build.service,
                    version=build.version, after=after, receipt=receipt, alpha=c.alpha, looks=receipt.looks,
                    must_start=c.must_start, watch_s=c.watch_s, **numbers)  # fmt: skip
