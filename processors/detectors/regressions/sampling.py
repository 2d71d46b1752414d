"""Regression tests compare like with like: both sides' requests kept under one and the same sampling.

Each ``OpStats`` counts its requests by the sampling their span states (``sampled``: ``0.1``, ``1``, ``unknown``;
``processors.model.sampling``). A rate or a latency distribution computed from kept traces stands for the real one
only when every request had the same chance to be kept; when the two sides of a comparison were kept with
different probabilities, or either side with a mix of them (an error-keeping tail sampler that states its
probabilities), the test is not run: the comparison is reported as ``InsufficientData`` with the reason
(``sampling differs: 0.1 in 1.0, 1 in 1.1``). Statistics without sampling counts (relayed by an older daemon)
are compared as before.
"""

from __future__ import annotations

from processors.detectors.regressions.stats import OpStats


def describe(op: OpStats) -> str:
    """One side's sampling: its probability's label, or the mix with the requests at each."""
    if len(op.sampled) == 1:
        return next(iter(op.sampled))
    return "mixed: " + ", ".join(f"{label} ({n} requests)" for label, n in sorted(op.sampled.items()))


def sampling_differs(before: OpStats, after: OpStats, comparison: str) -> str:
    """Why ``before`` and ``after`` cannot be compared for their sampling ("" when they can)."""
    if not before.sampled or not after.sampled:
        return ""
    for op, side in ((after, f"{after.version} now"), (before, f"the {comparison}")):
        if len(op.sampled) > 1:
            return f"sampling is not uniform in {side}: {describe(op)}; rates from kept traces are biased"
    if set(before.sampled) != set(after.sampled):
        return (f"sampling differs: {describe(before)} in the {comparison} ({before.version}), {describe(after)} in "
                f"{after.version} now; traces kept with different probabilities are not comparable")  # fmt: skip
    return ""
