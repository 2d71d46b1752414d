"""The proof judge's sampling rule: rates are compared only between builds kept under one and the same sampling.

Each build's requests are counted by the sampling their spans state (``Tally.sampled``, by label: ``0.1``, ``1``,
``unknown``). An error rate or a share of slow requests computed from kept traces estimates the real one only when
every request had the same chance to be kept. So a verdict that compares rates (``FIXED``, ``WORSE``, and every
latency outcome) stands only when the judged build and each build it is compared with were each kept under a single
sampling, the same for all; else it becomes ``INSUFFICIENT``, with the reason: ``sampling differs: 0.1 on 1.1, 1 on
1.2`` or ``sampling is not uniform on 1.2: ...`` (a mix of probabilities, as an error-keeping tail sampler that
states its probabilities makes: the mix is correlated with status, which the per-label errors show).

Why not weight (Horvitz-Thompson, each kept request counting ``1 / p``)? The exact conditional binomial tests the
judge relies on take counts, not weighted sums, and an unknown probability (no tracestate) cannot be weighted at
all; the honest answer is that the comparison cannot be made, and by how much the builds differ.

A ``NOT_FIXED`` from an error or collision signature still occurring on the build stands: an occurrence is evidence
whatever the sampling. Every verdict's receipt carries the sampling of the builds it compared (``Receipt.sampling``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from processors.connectors.proofs.contracts import LatencySignature
from processors.connectors.proofs.decision import Decision
from processors.connectors.proofs.tallies import Bound, Build, Tally
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE

RATE_OUTCOMES = frozenset({FIXED, WORSE})


def describe(t: Tally) -> str:
    """A build's sampling in a word (``0.1``, ``unknown``), or its mix with requests and errors per probability."""
    if len(t.sampled) == 1:
        return next(iter(t.sampled))
    if not t.sampled:
        return "unknown"
    mix = ", ".join(f"{label} ({n} requests, {t.sampled_errors.get(label, 0)} errors)"
                    for label, n in sorted(t.sampled.items(), key=lambda kv: (-kv[1], kv[0])))  # fmt: skip
    return f"mixed: {mix}"


def compared(
    earlier: list[Build],
    named: tuple[str, str],
    settled: Callable[[Build], Tally],
    has_signature: Callable[[Build], bool],
) -> list[tuple[Build, Tally]]:
    """The earlier builds a verdict compares with (and their counts): the previous one, those ``named`` (the
    contract's own and its baseline), and the latest on which the signature occurred."""
    with_signature = [b for b in earlier if has_signature(b)][-1:]
    picked = {b.version: b for b in (*earlier[-1:], *(b for b in earlier if b.version in named), *with_signature)}
    return [(b, settled(b)) for b in picked.values()]


def sampling_reason(build: Build, t: Tally, others: list[tuple[Build, Tally]]) -> str:
    """Why the rates of ``build`` and of ``others`` cannot be compared for their sampling ("" when they can)."""
    for b, tally in [(build, t), *others]:
        if len(tally.sampled) > 1:
            return (f"sampling is not uniform on {b.version}: {describe(tally)}; a mix of sampling probabilities "
                    "biases the rates computed from kept traces")  # fmt: skip
    mine = set(t.sampled)
    for b, tally in others:
        if tally.sampled and mine and set(tally.sampled) != mine:
            return (f"sampling differs: {describe(tally)} on {b.version}, {describe(t)} on {build.version}; rates "
                    "from traces kept with different probabilities are not comparable")  # fmt: skip
    return ""


def gate(
    out: list[Decision], bound: Bound, build: Build, t: Tally, others: list[tuple[Build, Tally]], emitted: list[str]
) -> list[Decision]:
    """The decisions ``out`` with each rate-based one turned ``INSUFFICIENT`` (once per build) when the sampling of
    ``build`` and ``others`` forbids comparing rates; every receipt given the sampling of the builds compared."""
    seen = {b.version: describe(tally) for b, tally in [(build, t), *others] if tally.sampled}
    reason = sampling_reason(build, t, others)
    latency = isinstance(bound.signature, LatencySignature)
    kept: list[Decision] = []
    for d in out:
        if reason and (d.outcome in RATE_OUTCOMES or (latency and d.outcome == NOT_FIXED)):
            if INSUFFICIENT in emitted or any(k.outcome == INSUFFICIENT for k in kept):
                continue
            d = replace(d, outcome=INSUFFICIENT, sampling=reason, unweighted=d.outcome)
        elif reason and d.outcome == INSUFFICIENT:
            d = replace(d, sampling=reason)
        kept.append(replace(d, receipt=d.receipt.model_copy(update={"sampling": seen})))
    return kept
