"""A consistent probability sampler as the OTel spec "TraceState: Probability Sampling" describes it (OTEP 235).

A trace is kept when the randomness of its id (the low 56 bits) is at or above the rejection threshold
``round((1 - p) * 2**56)``; a kept span says so in its tracestate, ``ot=th:<threshold hex, trailing zeros cut>``
(``th:0``: kept always). The Python SDK's ``TraceIdRatioBased`` writes no threshold: this is what a conformant one
writes, for the scenarios that run builds under sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, TraceState, get_current_span
from opentelemetry.util.types import Attributes

_BITS = 56


def threshold_hex(probability: float) -> str:
    """The ``th`` value of ``probability``: 14 hex digits with the trailing zeros cut (``0`` for 1.0)."""
    threshold = round((1.0 - probability) * (1 << _BITS))
    return f"{threshold:014x}".rstrip("0") or "0"


class ConsistentProbabilitySampler(Sampler):
    """Keeps a trace with ``probability``, the same decision for every span of it; counts the kept roots."""

    def __init__(self, probability: float) -> None:
        self.probability = probability
        self.threshold = round((1.0 - probability) * (1 << _BITS))
        self.th = threshold_hex(probability)
        self.kept_roots = 0

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        if trace_id & ((1 << _BITS) - 1) < self.threshold:
            return SamplingResult(Decision.DROP)
        if not get_current_span(parent_context).get_span_context().is_valid:
            self.kept_roots += 1
        state = trace_state or TraceState()
        state = state.update("ot", f"th:{self.th}") if "ot" in state else state.add("ot", f"th:{self.th}")
        return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes, state)

    def get_description(self) -> str:
        return f"ConsistentProbabilitySampler{{{self.probability}}}"
