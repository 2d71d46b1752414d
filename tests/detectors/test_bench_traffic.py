"""The bench's benign traffic (``bench.otlp_gen``), stretched over several windows: no hang, no contention."""

from __future__ import annotations

from bench.otlp_gen import generate_run
from processors.detectors.contention import ContentionConfig, ContentionDetector
from processors.detectors.hangs import HangConfig, HangDetector
from processors.state.config import WindowConfig
from streamer.decode.otlp import decode_traces_proto
from tests.detectors.run import findings
from tests.detectors.traffic import T0


def test_the_bench_traffic_is_neither_hung_nor_contended() -> None:
    """40k spans of the bench's shop at 20 traces/s (four windows, every hop's distribution ready after the
    first): both detectors judge every window and find nothing."""
    spans = [s for m in generate_run(40_000, seed=7, start_ns=T0, traces_per_s=20.0).messages
             for s in decode_traces_proto(m)]  # fmt: skip
    w = WindowConfig()
    hangs = HangDetector(HangConfig(), w)
    assert findings(hangs, spans, w) == []
    assert hangs.telemetry.events["windows_closed"] >= 3 and len(hangs._thresholds) > 10  # judged, not skipped
    contention = ContentionDetector(ContentionConfig(), w)
    assert findings(contention, spans, w) == []
    assert contention.telemetry.events["windows_closed"] >= 3
