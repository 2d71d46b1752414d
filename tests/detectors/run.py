"""Run an ingest-stage detector in-process over assembled traffic (no engines): traces in, watermarks, findings out."""

from __future__ import annotations

from collections.abc import Sequence

from processors.api.component import Emit, Processor
from processors.model.finding import FindingEvent
from processors.model.span import Span
from processors.state.config import WindowConfig
from tests.detectors.traffic import assemble


def findings(detector: Processor, spans: Sequence[Span], windows: WindowConfig | None = None) -> list[FindingEvent]:
    """Every finding ``detector`` publishes over ``spans`` (assembled with the default ``[windows]``)."""
    out = Emit()
    for watermark, traces, open_since in assemble(spans, windows):
        for trace in traces:
            detector.on_trace(trace, ())
        detector.on_watermark(watermark, open_since, out)
    assert out.quarantined == []
    found = [e for e in out.events if isinstance(e, FindingEvent)]
    assert len(found) == len(out.events)
    return found
