"""Every bound of the daemon, forced: each shows on /metrics as trace_repro_dropped_total{component, reason}.

The stages run in-process with their processors built from the components list (as the daemon builds them) and
one ``Metrics`` registry; each test squeezes one bound to its minimum, feeds just enough input to overflow it, and
reads the Prometheus text exposition the /metrics endpoint serves.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from processors.model.events import Access, CdcOp, DbOperation, LockMode, RowChange
from processors.model.outputs import IncidentEvent
from streamer import config
from streamer.components import default
from streamer.decode import internal as wire
from streamer.decode.registry import Record
from streamer.runtime.context import RuntimeContext, create, stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from tests.fake_clock import FakeClock
from tests.otlp_factory import ShopTelemetry, to_proto
from tests.regressions.builders import access as evidence_access
from tests.regressions.builders import incident

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
SPANS = "otlp_spans"
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"
ENV = {"TRACE_REPRO_WINDOWS__WINDOW_S": "10", "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "1",
       "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0", "TRACE_REPRO_WINDOWS__IDLE_S": "30"}  # fmt: skip


def dropped(metrics: Metrics) -> dict[tuple[str, str], float]:
    """trace_repro_dropped_total by (component, reason), parsed from the /metrics text."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == "trace_repro_dropped_total":
                out[(sample.labels["component"], sample.labels["reason"])] += sample.value
    return out


class Ingest:
    """The ingest stage with the default components, fed OTLP messages at consecutive offsets."""

    def __init__(self, **env: str) -> None:
        self.settings = config.load(None, env={**ENV, **{f"TRACE_REPRO_{k}": v for k, v in env.items()}})
        self.metrics, self.clock, tracker = Metrics(), FakeClock(T0), PinTracker()
        processors = stage_processors(self.settings, self.metrics, self.clock, "ingest", tracker, default().factories)
        self.stage = IngestStage(self.settings, self.metrics, self.clock, tracker=tracker, processors=processors)
        self.shop = ShopTelemetry()
        self.offset = 0

    def requests(self, *starts_s: float, route: str = "/orders/{id}/capture", error: bool | BaseException = False,
                 statements: tuple[tuple[str, str], ...] = ()) -> None:  # fmt: skip
        """One message with a request starting at each of ``starts_s`` (seconds after T0)."""
        for at in starts_s:
            self.shop.request(route, error=error, statements=statements, start_ns=T0 + int(at * S))
        self.stage.process([Record(SPANS, 0, self.offset, None, to_proto(self.shop.take()))])
        self.offset += 1


def test_trace_bounds_show_on_metrics() -> None:
    """max_open_traces closes the least recently fed trace early; max_spans_per_trace drops the excess spans."""
    p = Ingest(WINDOWS__MAX_OPEN_TRACES="1", WINDOWS__MAX_SPANS_PER_TRACE="2")
    p.requests(1.0, 1.1, statements=((UPDATE, "('paid', 1)"),))  # two traces of three spans each
    got = dropped(p.metrics)
    assert got[("traces", "max_open_traces")] == 1
    assert got[("traces", "max_spans_per_trace")] == 2


def test_window_bounds_show_on_metrics() -> None:
    """Too many open windows drop the oldest, per aggregate (CALLS windows and the regression statistics)."""
    p = Ingest(WINDOWS__MAX_WINDOWS="2", WINDOWS__MAX_OPEN_TRACES="1", WINDOWS__ALLOWED_LATENESS_S="1000")
    p.requests(1, 11, 21, 31)  # each trace closes the one before (the open-trace bound): three windows fed
    got = dropped(p.metrics)
    for component, window in (("calls", "calls"), ("regressions", "stats")):
        assert got[(component, f"{window}_bound")] == 1


def test_late_traces_show_on_metrics() -> None:
    """A trace for a window that has closed already is left out of it, counted per aggregate."""
    p = Ingest()
    p.requests(1)
    p.requests(41)  # the watermark passes the first window: it closes
    p.requests(2)  # a trace for it, closed by the next tick
    p.requests(80)
    got = dropped(p.metrics)
    for component, window in (("calls", "calls"), ("regressions", "stats")):
        assert got[(component, f"{window}_late")] == 1


def test_statement_cache_and_signature_bounds_show_on_metrics() -> None:
    """The SQL shape cache evicts (counted); error signatures and their code sites beyond the bound fold."""
    p = Ingest(SQL__STATEMENT_CACHE="1", REGRESSIONS__MAX_SIGNATURES="1")
    p.requests(1, statements=((UPDATE, "('paid', 1)"), ("SELECT * FROM orders WHERE id = %s", "(1,)")))
    p.requests(1.2, error=ValueError("a"))
    p.requests(1.4, error=KeyError("b"))
    p.requests(41)
    p.requests(80)
    got = dropped(p.metrics)
    assert got[("sql", "statement_cache")] == 1
    assert got[("regressions", "max_signatures")] == 1


def test_proof_desk_bounds_show_on_metrics() -> None:
    """The judge keeps max_builds builds per service and max_keys routes per build; the desk max_fingerprints."""
    p = Ingest(PROOF__MAX_BUILDS="2", PROOF__MAX_KEYS="16", PROOF__MAX_FINGERPRINTS="16")
    for i in range(17):
        p.requests(1 + i / 100, route=f"/r{i}")
    for version in ("2.0.0", "3.0.0"):
        p.shop = ShopTelemetry(version=version)
        p.requests(2)
    p.requests(60)  # the watermark closes every trace
    for i in range(17):
        culprit = evidence_access("1.0", f"f{i}", "/r", at_ms=T0 / MS)
        event = incident(culprit, evidence_access("1.0", f"g{i}", "/r", at_ms=T0 / MS + 1))
        assert isinstance(event, IncidentEvent)
        p.stage.on_event(event.model_copy(update={"fingerprint": f"fp{i}"}))
    got = dropped(p.metrics)
    assert got[("proof", "max_keys")] >= 1
    assert got[("proof", "max_builds")] == 1
    assert got[("proof", "max_fingerprints")] == 1


class Entities:
    """The entities stage with the default components, fed internal records at consecutive offsets."""

    def __init__(self, **env: str) -> None:
        settings = config.load(None, env={**ENV, **{f"TRACE_REPRO_{k}": v for k, v in env.items()}})
        self.metrics, self.clock, tracker = Metrics(), FakeClock(T0), PinTracker()
        clock = self.clock
        processors = stage_processors(settings, self.metrics, clock, "entities", tracker, default().factories)
        self.stage = EntityStage(settings, self.metrics, clock, tracker=tracker, processors=processors)
        self.topic = settings.kafka.accesses_topic
        self.offset = 0

    def send(self, *events: Access | RowChange) -> None:
        records = []
        for e in events:
            key = e.entity if isinstance(e, Access) else e.entity_key
            value = wire.encode_access(e) if isinstance(e, Access) else wire.encode_row_change(e)
            records.append(Record(self.topic, 0, self.offset, key.encode(), value))
            self.offset += 1
        self.stage.process(records)

    def upstream(self, at_s: float) -> None:
        """Stage 1's low watermark for its spans partition."""
        self.clock.now = max(self.clock.now, T0 + int(at_s * S))
        value = wire.encode_watermark(wire.Watermark(T0 + int(at_s * S), ("otlp_spans/0",)))
        self.stage.process([Record(self.topic, 0, self.offset, None, value)])
        self.offset += 1


def write(row: int, trace: str, at_s: float, op: DbOperation = DbOperation.WRITE) -> Access:
    start = T0 + int(at_s * S)
    return Access(entity=f"orders:{row}", table="orders", operation=op, lock=LockMode.NONE, trace_id=trace * 32,
                  span_id=f"{trace}{int(at_s * 1000):015d}", service="shop", version="1", start_ns=start,
                  end_ns=start + MS, statement=UPDATE, set_values=(("status", trace),), tx_id=trace)  # fmt: skip


def change(row: int, at_s: float, tx: str) -> RowChange:
    at_ms = (T0 + int(at_s * S)) // MS
    return RowChange(table="public.orders", op=CdcOp.UPDATE, key=(("id", row),), before={"status": "x"},
                     after={"status": tx}, commit_ts_ms=at_ms, ts_ms=at_ms, lsn=int(at_s * 1000), tx_id=tx)  # fmt: skip


def test_correlation_bounds_show_on_metrics() -> None:
    """Write histories per row and rows with a history are bounded; so are row changes waiting for their writer."""
    p = Entities(CORRELATION__MAX_ENTITIES="1", CORRELATION__HISTORY_PER_ENTITY="1",
                 CORRELATION__MAX_PENDING_CHANGES="1")  # fmt: skip
    p.send(write(1, "a", 1.0), write(1, "b", 1.1), write(2, "c", 1.2))  # 2nd write of row 1; a 2nd row
    p.send(change(3, 1.3, "x"), change(4, 1.4, "y"))  # nobody wrote rows 3 and 4: both wait, one is evicted
    got = dropped(p.metrics)
    assert got[("correlation", "history_per_entity")] == 1
    assert got[("correlation", "max_entities")] == 1
    assert got[("correlation", "max_pending_changes")] == 1


def test_collision_detector_bounds_show_on_metrics() -> None:
    """Rows with a history, accesses per row, traces kept for write skew: each bound counts what it drops."""
    p = Entities(COLLISIONS__MAX_ENTITIES="1", COLLISIONS__HISTORY_PER_ENTITY="2", COLLISIONS__MAX_TRACES="1")
    p.send(write(1, "a", 1.0), write(1, "b", 1.1), write(1, "c", 1.2), write(2, "d", 1.3))
    got = dropped(p.metrics)
    assert got[("collisions", "history_per_entity")] == 1
    assert got[("collisions", "max_traces")] == 3
    assert got[("collisions", "max_entities")] == 1


def test_reported_occurrences_bound_shows_on_metrics() -> None:
    """The memory of reported occurrences is bounded: two collisions judged with room for one."""
    p = Entities(COLLISIONS__MAX_REPORTED="1", COLLISIONS__SETTLE_S="0")
    for row in (1, 2):
        read = write(row, "a", 1.0, DbOperation.READ)
        p.send(read, write(row, "b", 1.001, DbOperation.READ), write(row, "a", 1.002), write(row, "b", 1.003))
    p.upstream(60.0)  # event time passes both rows' deadlines
    assert dropped(p.metrics)[("collisions", "max_reported")] == 1


def test_file_sink_replay_memory_bound_shows_on_metrics(tmp_path: Path) -> None:
    """The file sink remembers at most ``remember`` event ids per kind against replays; forgetting is counted."""
    metrics = Metrics()
    settings = config.load(None, env={"TRACE_REPRO_FILE_SINK__ENABLED": "true",
                                      "TRACE_REPRO_FILE_SINK__DIRECTORY": str(tmp_path),
                                      "TRACE_REPRO_FILE_SINK__REMEMBER": "1"})  # fmt: skip
    [factory] = [f for f in default().factories if f.name == "file_sink"]
    sink = create(factory, RuntimeContext(settings, metrics, FakeClock()), settings)

    async def run() -> None:
        culprit = evidence_access("1.0", "f", "/r", at_ms=T0 / MS)
        for i in range(2):
            event = incident(culprit, evidence_access("1.0", "g", "/r", at_ms=T0 / MS + 1))
            await sink.write(event.model_copy(update={"occurrence": f"o{i}"}))
        await sink.flush()
        await sink.close()

    asyncio.run(run())
    assert dropped(metrics)[("file_sink", "remember")] == 1


def test_byte_bounds_show_on_metrics() -> None:
    """Where item sizes vary, bytes are bounded too: open traces whose spans carry 60 KiB exception messages,
    remembered writes with 300 KiB statements and row changes with 300 KiB images, against 1 MiB bounds, stay
    under them and count what they drop (traces closed early, rows forgotten, changes written uncorrelated);
    ordinary traffic under the shipped bounds drops nothing."""
    mib, text = 1 << 20, "x" * 60_000
    p = Ingest(WINDOWS__MAX_OPEN_TRACE_BYTES=str(mib))
    p.requests(*(1 + i / 100 for i in range(20)), error=RuntimeError(text))
    assert dropped(p.metrics)[("traces", "max_open_trace_bytes")] >= 1 and p.stage.traces.bytes <= mib
    e = Entities(CORRELATION__MAX_HISTORY_BYTES=str(mib), CORRELATION__MAX_PENDING_BYTES=str(mib))
    big = "x" * 300_000
    e.send(*(replace(write(row, "a", 1.0 + row / 10), statement=big) for row in range(5)))
    e.send(*(replace(change(10 + row, 1.0, "z"), after={"status": "z", "note": big}) for row in range(5)))
    got = dropped(e.metrics)
    assert got[("correlation", "max_history_bytes")] >= 1 and got[("correlation", "max_pending_bytes")] >= 1
    assert e.stage.correlator.bytes <= mib and e.stage.pending_changes < 5
    correlated = [s for f in text_string_to_metric_families(generate_latest(e.metrics.registry).decode())
                  for s in f.samples if s.name == "trace_repro_row_changes_correlated_total"]  # fmt: skip
    assert [(s.labels, s.value) for s in correlated] == [({"strength": "none"}, 5 - e.stage.pending_changes)]

    ordinary = Ingest()
    ordinary.requests(*(1 + i / 100 for i in range(20)), error=RuntimeError("boom"),
                      statements=((UPDATE, "('paid', 1)"),))  # fmt: skip
    assert dropped(ordinary.metrics)[("traces", "max_open_trace_bytes")] == 0
    assert 0 < ordinary.stage.traces.bytes < mib


@pytest.mark.parametrize("component", ["traces", "calls", "sql", "regressions", "proof", "correlation", "collisions"])
def test_every_bound_is_exported_at_zero_before_it_drops(component: str) -> None:
    """A bound shows on /metrics at 0 from the start, so that an alert's increase() sees its first drop."""
    metrics = Ingest().metrics if component not in ("correlation", "collisions") else Entities().metrics
    assert any(c == component for c, _ in dropped(metrics))
