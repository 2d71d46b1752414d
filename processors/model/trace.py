"""A closed trace: the spans of one trace, complete as far as event time can tell (stage 1 closes it)."""

from __future__ import annotations

from dataclasses import dataclass

from processors.model.span import Span


@dataclass(frozen=True, slots=True)
class ClosedTrace:
    """A trace whose spans are (as far as event time can tell) complete."""

    trace_id: str
    spans: tuple[Span, ...]
    late: bool = False  # reassembled after it had closed once
    forced: bool = False  # closed early by the open-trace bound
    # The input partition the trace came from ("otlp_spans/3"; the first one when its spans came from several):
    # windowed aggregates keep one contribution per input partition, so that replicas add up
    # (processors.pipeline.calls).
    part: str = ""

    @property
    def root(self) -> Span:
        """The root span, or the earliest span when the root is missing."""
        for s in self.spans:
            if not s.parent_id:
                return s
        return min(self.spans, key=lambda s: s.start_ns)

    @property
    def start_ns(self) -> int:
        return min(s.start_ns for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.spans)
