"""What the ingest stage does with every closed trace besides its rows: each processor's ``on_trace`` (one that
raises is counted against that processor, ``trace_repro_dropped_total{component, reason="error"}``, and the others
still get the trace) and the count of its statements that named no row by its key, per table up to a bound."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processors.api.component import Processor
from processors.model.events import Access
from processors.model.trace import ClosedTrace
from streamer import config
from streamer.components import default
from streamer.decode.registry import Record
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from tests.fake_clock import FakeClock
from tests.otlp_factory import ShopTelemetry, to_proto

S = 1_000_000_000
T0 = 1_700_000_000 * S
ENV = {
    "TRACE_REPRO_WINDOWS__WINDOW_S": "10",
    "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "1",
    "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
}


class Seen(Processor):
    """Records the traces it gets; raises on each when ``fail``."""

    def __init__(self, name: str, *, fail: bool) -> None:
        self.name = name
        self.fail = fail
        self.traces: list[str] = []

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        self.traces.append(trace.trace_id)
        if self.fail:
            raise RuntimeError("injected")


def errors(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "trace_repro_dropped_total" and sample.labels["reason"] == "error":
                out[sample.labels["component"]] = out.get(sample.labels["component"], 0) + sample.value
    return out


def test_a_processor_that_raises_on_a_trace_is_counted_and_the_others_still_get_it() -> None:
    settings = config.load(None, env=ENV)
    metrics, clock, tracker = Metrics(), FakeClock(T0), PinTracker()
    failing, after = Seen("failing", fail=True), Seen("after", fail=False)
    built = stage_processors(settings, metrics, clock, "ingest", tracker, default().factories)
    processors = [(failing, ()), *built, (after, ())]
    stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=processors)
    shop = ShopTelemetry()
    for offset, at in enumerate((1, 2, 40)):  # the third request's watermark closes the first two traces
        shop.request("/orders/{id}", start_ns=T0 + at * S)
        out = stage.process([Record("otlp_spans", 0, offset, None, to_proto(shop.take()))])
    assert len(failing.traces) == 2
    assert after.traces == failing.traces
    assert errors(metrics) == {"failing": 2}
    assert out.graph.traces or out.graph.operations  # the trace's own rows were made, not rolled back


def unkeyed(metrics: Metrics) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "trace_repro_unkeyed_statements_total":
                out[sample.labels["table"]] = sample.value
    return out


def test_unkeyed_statements_are_counted_per_table_up_to_the_bound_then_as_other() -> None:
    settings = config.load(None, env={**ENV, "TRACE_REPRO_SQL__MAX_TABLES": "2"})
    metrics, clock, tracker = Metrics(), FakeClock(T0), PinTracker()
    stage = IngestStage(settings, metrics, clock, tracker=tracker)
    shop = ShopTelemetry()
    tables = ("orders", "orders", "items", "carts", "users", "carts", "orders")
    for offset, table in enumerate((*tables, None)):  # the last request's watermark closes the others
        statements = () if table is None else ((f"UPDATE {table} SET note = %s WHERE region = %s", "('x', 'eu')"),)
        shop.request("/orders/{id}", statements=statements, start_ns=T0 + (1 + offset) * S * (5 if table else 10))
        stage.process([Record("otlp_spans", 0, offset, None, to_proto(shop.take()))])
    assert unkeyed(metrics) == {"orders": 3, "items": 1, "_other": 3}
