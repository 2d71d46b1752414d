"""Containment, stages driven in process: whatever one record or one unit of state raises stays in its component.

Faults are injected (a function made to raise for one message, trace, row or change), not produced by particular
hostile inputs: whatever raises there, now or later, is contained the same way. Each test shows what escaped or was
lost before: the exception left ``Stage.process`` (a crash, and the same batch again on every replay), or what the
step had found was lost and its pins stayed.
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from opentelemetry.trace import SpanKind

import streamer.decode.otlp
import streamer.runtime.ingest
import streamer.runtime.stage
from processors.detectors.collisions import CollisionDetector
from processors.model.events import Access
from streamer.decode import internal
from streamer.runtime.metrics import Metrics
from tests.otlp_factory import ShopTelemetry, to_proto
from tests.runtime.chain import CDC, MS, SPANS, T0, Chain, S, Scenario

QUICK = {"TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2", "TRACE_REPRO_WINDOWS__IDLE_S": "0.3"}


class Injected(ValueError):
    """The fault the tests inject."""


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The stages' structlog lines, as JSON with the traceback rendered."""
    buf = io.StringIO()
    renderers = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    logger = structlog.wrap_logger(structlog.PrintLogger(buf), processors=renderers)
    monkeypatch.setattr(streamer.runtime.stage, "log", logger)
    return buf


def lines(buf: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, buf.getvalue().splitlines()) if line["event"] == event]


def dropped(metrics: Metrics, component: str, reason: str) -> int:
    return metrics.telemetry(component).dropped.get(reason, 0)


def request(shop: ShopTelemetry, name: str, row: int, at_ns: int) -> None:
    """A server span named ``name`` (``"poison"`` for the one the tests make unreadable) with one DB span."""
    with shop.tracer.start_as_current_span(name, kind=SpanKind.SERVER, start_time=at_ns, end_on_exit=False) as root:
        root.set_attribute("http.route", f"/{name}")
        db = shop.tracer.start_span("db", kind=SpanKind.CLIENT, start_time=at_ns + MS)
        db.set_attribute("db.system.name", "postgresql")
        db.set_attribute("db.query.text", "UPDATE orders SET status = %s WHERE id = %s")
        db.set_attribute("db.statement.parameters", f"('paid', {row})")
        db.end(end_time=at_ns + 2 * MS)
        root.end(end_time=at_ns + 3 * MS)


def keyed_chain() -> Chain:
    """Both stages, with the orders table's key known (as if learned from Debezium before)."""
    chain = Chain(QUICK)
    chain.ingest.extractor.keys.load([("orders", ["id"])])
    return chain


def accesses(chain: Chain, produced: list[Any]) -> set[bytes]:
    """The entity keys of the accesses among ``produced`` (on the internal topic, packed)."""
    topic = chain.settings.kafka.accesses_topic
    events = [e for m in produced if m.topic == topic for e in internal.decode_all(m.value or b"")]
    return {e.entity.encode() for e in events if isinstance(e, Access)}


# ---- stage 1 --------------------------------------------------------------------------------------------------


def test_a_span_whose_detail_raises_is_dead_lettered_and_the_other_traces_of_its_message_kept(
    monkeypatch: pytest.MonkeyPatch, logged: io.StringIO
) -> None:
    """A span's attributes are read lazily; reading those of one span raises (as an integer too long to convert did).
    Its message goes to the dead-letter topic naming the decoder and the position, the span is dropped and counted,
    and the message's other trace is assembled, closed and written. (Before: the detail was read at the end of the
    batch, outside any record's guard, and the exception left ``Stage.process``.)"""
    real = streamer.decode.otlp._span_detail

    def detail(ext: Any, sp: Any) -> Any:
        if sp.name == "poison":
            raise Injected("Exceeds the limit (4300 digits) for integer string conversion")
        return real(ext, sp)

    monkeypatch.setattr(streamer.decode.otlp, "_span_detail", detail)
    chain = keyed_chain()
    shop = ShopTelemetry()
    request(shop, "good", 1, T0)
    request(shop, "poison", 2, T0 + MS)
    message = chain._record(SPANS, 0, None, to_proto(shop.take()))
    out = chain.ingest.process([message])
    [dead] = [m for m in out.produce if m.topic == chain.settings.kafka.dlq_topic]
    headers = dict(dead.headers)
    assert (headers["reason"], headers["component"]) == (b"internal_error:Injected", b"decode")
    assert (headers["source.topic"], headers["source.offset"], dead.value) == (SPANS.encode(), b"0", message.value)
    assert dropped(chain.metrics, "decode", "span_detail") == 1
    [failed] = lines(logged, "record.failed")
    assert "Injected" in failed["exception"]  # the first of its kind, with its traceback
    assert len(chain.ingest.traces) == 2  # the good trace, and the poison trace's readable DB span
    chain.clock.now = T0 + 20 * S
    tick = ShopTelemetry()
    request(tick, "tick", 3, T0 + 20 * S)
    out = chain.ingest.process([chain._record(SPANS, 0, None, to_proto(tick.take()))])
    assert {r["root"] for r in out.graph.traces} == {"/good", "db"}
    assert accesses(chain, out.produce) == {b"orders:1", b"orders:2"}


@pytest.mark.parametrize("where", ["accesses_of", "trace_rows", "calls.add"])  # the last: its accesses packed
def test_a_trace_whose_closing_raises_is_quarantined_and_the_others_close(
    where: str, monkeypatch: pytest.MonkeyPatch, logged: io.StringIO
) -> None:
    """Three traces close in one batch; handling the second raises when it closes (its SQL analysis, its graph rows
    half-way, or its CALLS once its accesses are queued to be packed). It is quarantined: none of its rows or
    accesses go out, it is counted and logged with the input offset it came from, and its pin is released; the other
    two are written and sent on. (Before: the exception left ``Stage.process`` in a later, innocent batch, with
    nothing to dead-letter: a crash on every replay.)"""
    chain = keyed_chain()
    shop = ShopTelemetry()
    for row in (1, 2, 3):
        request(shop, f"r{row}", row, T0 + row * MS)
        chain.ingest.process([chain._record(SPANS, 0, None, to_proto(shop.take()))])
    bad = chain.ingest.traces.open_ids()[1]
    owner: Any = type(chain.ingest.calls) if where == "calls.add" else streamer.runtime.ingest
    real = getattr(owner, where.rpartition(".")[2])

    def raising(*args: Any) -> Any:  # (the trace, and more; CallWindows.add: the windows first)
        result = real(*args)  # (trace_rows has added some of its rows by then)
        if any(getattr(a, "trace_id", None) == bad for a in args):
            raise Injected(f"{where} of {bad}")
        return result

    monkeypatch.setattr(owner, where.rpartition(".")[2], raising)
    chain.clock.now = T0 + 20 * S
    request(shop, "tick", 4, T0 + 20 * S)
    out = chain.ingest.process([chain._record(SPANS, 0, None, to_proto(shop.take()))])
    assert sorted(r["root"] for r in out.graph.traces) == ["/r1", "/r3"]
    assert bad not in {r["trace"] for r in out.graph.spans}
    assert accesses(chain, out.produce) == {b"orders:1", b"orders:3"}
    assert dropped(chain.metrics, "traces", "quarantined") == 1
    [line] = lines(logged, "state.quarantined")
    assert (line["component"], line["what"], line["inputs"]) == ("traces", f"trace {bad}", [f"{SPANS}/0@1"])
    assert "Injected" in line["exception"]
    chain.ingest.release(out.release)
    pinned = chain.ingest.tracker.pins._counts[(SPANS, 0)]
    # The good traces (0, 2) feed open windows, which hold the oldest offset of the partition; the tick (3) is open;
    # the bad one (1): nothing.
    assert sorted(pinned) == [0, 3]


def test_an_error_at_the_end_of_a_batch_never_leaves_the_stage(
    monkeypatch: pytest.MonkeyPatch, logged: io.StringIO
) -> None:
    """Something in the stage's own bookkeeping at the end of a batch raises (here: publishing the low watermark).
    ``process`` still returns the batch's output with the pins it released, counts it and logs it with its traceback,
    once per kind; the next batch goes on. (Before: the exception left ``Stage.process``.)"""
    chain = Chain(QUICK)
    monkeypatch.setattr(chain.ingest, "_publish_watermark", lambda *a: (_ for _ in ()).throw(Injected("bug")))
    shop = ShopTelemetry()
    request(shop, "r1", 1, T0)
    chain.ingest.process([chain._record(SPANS, 0, None, to_proto(shop.take()))])
    chain.clock.now = T0 + 20 * S
    request(shop, "tick", 2, T0 + 20 * S)
    out = chain.ingest.process([chain._record(SPANS, 0, None, to_proto(shop.take()))])
    assert [r["root"] for r in out.graph.traces] == ["/r1"] and out.release == [((SPANS, 0), 0)]
    assert dropped(chain.metrics, "ingest", "batch_end_error") == 2
    [line] = lines(logged, "stage.batch_end_failed")
    assert "Injected" in line["exception"]


# ---- clock sanity -------------------------------------------------------------------------------------------------


def test_a_row_change_committed_years_ahead_is_dead_lettered_before_any_watermark_sees_it() -> None:
    """A row change committed ten years ahead comes first on the CDC topic, ordinary traffic after it (a lost update),
    with the spans and the row changes read by two stage-1 instances (``--workers``). The change is dead-lettered,
    nothing else is, and the lost update is found. (Before: its commit time moved the CDC instance's low watermark
    before it was dead-lettered; stage 2 refused every later watermark of that instance as being in the future, so
    its event time stayed where that instance last promised until the promise expired: here never, the lost update
    never found, and every watermark record of that instance dead-lettered.)"""
    scenario = Scenario()
    scenario.lost_update(7, T0 + 2 * S)
    _, key, value, topic = scenario.changes[0]
    future = json.loads(value)
    future["source"]["ts_ms"] += 10 * 365 * 86_400_000
    future["source"]["lsn"] = 8
    scenario.changes.insert(0, (T0 + S, key, json.dumps(future).encode(), topic))
    chain = Chain({**QUICK, "TRACE_REPRO_WINDOWS__UPSTREAM_EXPIRY_S": "600"}, owners=[((SPANS, 0),), ((CDC, 0),)])
    refused = []
    judge = chain.entities.process

    def process(records: Any) -> Any:
        out = judge(records)
        refused.extend(m for m in out.produce if m.topic == chain.settings.kafka.dlq_topic)
        return out

    chain.entities.process = process  # type: ignore[method-assign]
    found = chain.run(scenario, random.Random(1), wall_step_s=0.5, polls=True)
    assert [(e["entity"], e["anomaly"]) for e in found.incidents] == [("orders:7", "lost_update")]
    assert (found.dead_letters, len(refused)) == (1, 0)
    assert chain.metrics.telemetry("clock").dropped["future_time"] == 1
    assert chain.committable_everywhere()


# ---- stage 2 ------------------------------------------------------------------------------------------------------


def lost_updates(rows: tuple[int, ...]) -> Scenario:
    """A lost update on each of ``rows``, 1 ms apart (due in the same judging step), and a serial update after."""
    scenario = Scenario()
    for n, row in enumerate(rows):
        scenario.lost_update(row, T0 + S + n * MS)
    scenario.serial_update(50, T0 + 3 * S, "v")
    return scenario


def collisions(chain: Chain) -> CollisionDetector:
    [detector] = [p for p in chain.entities.processors if isinstance(p, CollisionDetector)]
    return detector


def test_a_row_whose_judging_raises_costs_that_row_only_and_releases_its_pins(
    monkeypatch: pytest.MonkeyPatch, logged: io.StringIO
) -> None:
    """Three rows with a lost update each are due in one step; judging the second raises (as a 'NaN' under an
    invariant did). The other two incidents are emitted, the failed row is counted and logged with the internal
    topic offsets it held, and every position becomes committable. (Before: the exception left the detector's hook
    in the middle of the step: the incidents it had found were marked reported but never emitted, the rows after it
    were never judged again and their pins stayed, so the committed offsets stopped.)"""
    chain = Chain(QUICK)
    detector = collisions(chain)
    real = detector.judge.judge

    def judge(key: str, *args: Any, **kw: Any) -> Iterator[Any]:
        if key == "orders:11":
            raise Injected("[<class 'decimal.InvalidOperation'>]")
        yield from real(key, *args, **kw)

    monkeypatch.setattr(detector.judge, "judge", judge)
    found = chain.run(lost_updates((10, 11, 12)), random.Random(1), wall_step_s=0.5, polls=True)
    assert sorted(e["entity"] for e in found.incidents) == ["orders:10", "orders:12"]
    assert dropped(chain.metrics, "collisions", "quarantined") == 1
    assert dropped(chain.metrics, "collisions", "error") == 0
    [line] = lines(logged, "state.quarantined")
    assert (line["component"], line["what"]) == ("collisions", "row orders:11")
    internal = chain.settings.kafka.accesses_topic
    assert line["inputs"] and all(i.startswith(f"{internal}/") for i in line["inputs"])
    assert chain.committable_everywhere()


def test_a_row_whose_crediting_raises_is_written_uncorrelated_and_the_others_credited(
    monkeypatch: pytest.MonkeyPatch, logged: io.StringIO
) -> None:
    """Crediting one row's changes raises: they are written uncorrelated (never guessed, never lost), the credit is
    counted and logged with their offsets, and the other rows' changes are credited to their writers. (Before: the
    exception left ``Stage.process``.)"""
    chain = Chain(QUICK)
    real = chain.entities.correlator.correlate_many

    def correlate_many(changes: Any) -> Any:
        if any(c.key == (("id", 11),) for c in changes):
            raise Injected("correlation")
        return real(changes)

    monkeypatch.setattr(chain.entities.correlator, "correlate_many", correlate_many)
    scenario = lost_updates((10, 11))
    found = chain.run(scenario, random.Random(1), wall_step_s=0.5, polls=True)
    lsns = sorted(scenario.credits)
    failed = {lsn for lsn in lsns if found.strengths[lsn] == "none"}
    assert len(failed) == 2 and set(found.strengths) == set(lsns)  # every change written; row 11's uncredited
    credited = {lsn: found.functions[span] for lsn, span in found.credits.items()}
    assert credited == {lsn: fn for lsn, fn in scenario.credits.items() if lsn not in failed}
    assert dropped(chain.metrics, "correlation", "quarantined") >= 1
    assert lines(logged, "state.quarantined")[0]["component"] == "correlation"
    assert chain.committable_everywhere()


def test_a_change_whose_graph_row_raises_is_quarantined_and_the_rest_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph row of one credited change raises: that change is quarantined (counted, its pin released); the
    other changes are written and the row's lost update is still found from the accesses."""
    chain = Chain(QUICK)
    real = streamer.runtime.entities.change_row
    scenario = lost_updates((10,))
    bad = min(scenario.credits)

    def change_row(change: Any, *args: Any) -> Any:
        if change.lsn == bad:
            raise Injected("row")
        return real(change, *args)

    monkeypatch.setattr(streamer.runtime.entities, "change_row", change_row)
    found = chain.run(scenario, random.Random(1), wall_step_s=0.5, polls=True)
    assert set(found.strengths) == set(scenario.credits) - {bad}
    assert dropped(chain.metrics, "correlation", "quarantined") == 1
    assert [e["entity"] for e in found.incidents] == ["orders:10"]
    assert chain.committable_everywhere()
