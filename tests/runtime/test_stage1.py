"""IngestStage without engines: SDK-encoded span messages in, graph rows, produced messages and pins out."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind

from processors.detectors.regressions.shares import KEY
from processors.model.events import Access, DbOperation, LockMode, Relay
from processors.model.span import Span
from streamer import config
from streamer.components import default
from streamer.decode import internal as wire
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Message, Record, StageOutput
from tests.fake_clock import FakeClock
from tests.otlp_factory import ShopTelemetry, ids, to_json, to_proto

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S  # a multiple of the 10 s window
W0 = f"{T0 // MS}-{T0 // MS + 10_000}"  # window [T0, T0 + 10 s)
SPANS = "otlp_spans"
TP = (SPANS, 0)
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"
LOCK = "SELECT * FROM orders WHERE id = %s FOR UPDATE"
# window 10 s, trace gap (and window grace) 1 s, lateness 0.5 s: watermark = newest span end - 0.5 s
ENV = {
    "TRACE_REPRO_WINDOWS__WINDOW_S": "10",
    "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "1",
    "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0.5",
    "TRACE_REPRO_WINDOWS__IDLE_S": "30",
    "TRACE_REPRO_GRAPH_POLICY__DETAIL": "all",
}


class SequentialIds(IdGenerator):
    """Deterministic trace and span ids, so that every run sees the same inputs."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._next = itertools.count(1)

    def generate_span_id(self) -> int:
        return next(self._next)

    def generate_trace_id(self) -> int:
        return (0x7A << 120) | next(self._next)


IDS = SequentialIds()
SHOP = ShopTelemetry()
SHOP.tracer.id_generator = IDS  # type: ignore[attr-defined]


class Pipe:
    """An IngestStage fed Records at consecutive offsets per partition, with a fake clock and its own metrics."""

    def __init__(self, **env: str) -> None:
        self.settings = config.load(None, env={**ENV, **env})
        self.clock = FakeClock(T0)
        self.metrics = Metrics()
        self.stage = IngestStage(self.settings, self.metrics, self.clock)
        self.stage.extractor.keys.load([("orders", ["id"])])  # as if loaded from the graph (learned before)
        self.positions: defaultdict[tuple[str, int], int] = defaultdict(int)
        self.encode = to_json if self.settings.kafka.span_encoding == "otlp_json" else to_proto

    def record(
        self, value: bytes | None, *, topic: str = SPANS, partition: int = 0, key: bytes | None = None
    ) -> Record:
        offset = self.positions[(topic, partition)]
        self.positions[(topic, partition)] += 1
        return Record(topic, partition, offset, key, value)

    def send(self, *values: bytes | None, partition: int = 0) -> StageOutput:
        return self.stage.process([self.record(v, partition=partition) for v in values])

    def spans(self, spans: Sequence[ReadableSpan]) -> StageOutput:
        return self.send(self.encode(spans))

    def tick(self, at_s: float) -> StageOutput:
        """A one-request message at T0 + at_s that moves the watermark to T0 + at_s + 1 ms - 0.5 s."""
        return self.spans(request(at_s, "/tick"))

    def committable(self, partition: int = 0) -> int:
        tp = (SPANS, partition)
        return self.stage.committable(tp, self.positions[tp])

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def request(
    at_s: float,
    route: str = "/orders/{id}/capture",
    *,
    statements: Sequence[tuple[str, str]] = (),
    function: str = "handler",
) -> tuple[ReadableSpan, ...]:
    """The SDK's spans of one request starting at T0 + at_s: server (1 ms), handler, one DB span per statement."""
    SHOP.request(route, statements=statements, function=function, start_ns=T0 + int(at_s * S))
    return SHOP.take()


def trace_id(spans: Sequence[ReadableSpan]) -> str:
    [tid] = ids(spans)[0]
    return tid


def closed_ids(out: StageOutput) -> set[str]:
    return {row["id"] for row in out.graph.traces}


def accesses(out: StageOutput, topic: str) -> list[tuple[bytes | None, Access]]:
    found = []
    for o in out.produce:
        if o.topic == topic:
            assert o.value is not None
            event = wire.decode(o.value)
            assert isinstance(event, Access)
            found.append((o.key, event))
    return found


# ---- (a) out-of-order messages --------------------------------------------------------------------------------


@pytest.mark.parametrize("parent_first", [True, False], ids=["parent_then_children", "children_then_parent"])
def test_out_of_order_messages_assemble_one_trace(parent_first: bool) -> None:
    """A trace split over two messages, in either order, closes once as one trace with all its spans."""
    p = Pipe()
    spans = request(1, statements=[(UPDATE, "('paid', 8812)")])
    server, children = spans[-1:], spans[:-1]
    first, second = (server, children) if parent_first else (children, server)
    assert p.spans(first).graph.traces == []
    assert p.spans(second).graph.traces == []
    assert len(p.stage.traces) == 1
    out = p.tick(3)  # watermark T0 + 2.501 s >= last end (T0 + 1.001 s) + gap
    tid = trace_id(spans)
    assert closed_ids(out) == {tid}
    assert {r["id"] for r in out.graph.spans} == ids(spans)[1]
    assert len(out.graph.child_of) == 2
    assert out.graph.traces[0]["root"] == "/orders/{id}/capture"
    assert out.release == [(TP, 0)]  # the trace held the oldest message of the partition that fed it
    assert p.metric("trace_repro_late_events_total", kind="span") == 0


def test_a_span_left_in_an_open_trace_keeps_nothing_of_its_message() -> None:
    """Spans are decoded lazily, but one still buffered when its batch ends has had its detail read: it keeps no
    reference into the decoded protobuf message (which would keep the whole message's parse alive)."""
    p = Pipe()
    spans = request(1, statements=[(UPDATE, "('paid', 8812)")])
    assert p.spans(spans).graph.traces == []
    [tid] = p.stage.traces.open_ids()
    trace = p.stage.traces._open.get(tid)
    assert trace is not None and len(trace.spans) == len(spans)
    assert all(s._source is None and type(s) is Span for s in trace.spans.values())  # (read: no LazySpan)
    assert {s.db is not None for s in trace.spans.values()} == {True, False}  # the detail read is the real one
    closed = p.tick(3)
    assert closed_ids(closed) == {trace_id(spans)}
    assert len(accesses(closed, p.settings.kafka.accesses_topic)) == 1


# ---- (b) windows close on the watermark -----------------------------------------------------------------------


def test_window_closes_on_the_watermark_and_not_before() -> None:
    """The window's CALLS rows appear only once the watermark reaches window end + grace."""
    p = Pipe()
    p.spans(request(1, statements=[(UPDATE, "('paid', 8812)")]))
    out = p.tick(11.4)  # watermark T0 + 10.901 s: the trace closes, its window needs T0 + 11 s
    assert len(out.graph.traces) == 1
    assert (out.graph.windows, out.graph.calls) == ([], [])
    assert p.metric("trace_repro_open_windows") == 1
    out = p.tick(11.5)  # watermark T0 + 11.001 s
    assert out.graph.windows == [{"id": W0, "start": T0 / MS, "end": T0 / MS + 10_000}]
    assert [(c["caller"], c["callee"], c["window"], c["count"], c["errors"]) for c in out.graph.calls] == [
        ("checkout", "postgresql", W0, 1, 0)
    ]
    assert p.metric("trace_repro_open_windows") == 0  # the ticks' traces are still open


def test_trace_crossing_the_window_end_counts_in_its_window() -> None:
    """A trace that starts before its window's end and finishes after it still counts in that window."""
    p = Pipe()
    p.spans(request(5, "/early"))  # makes window W0 exist and close on time
    t = T0 + int(9.9 * S)
    with SHOP.tracer.start_as_current_span("POST /slow", kind=SpanKind.SERVER, start_time=t, end_on_exit=False) as root:
        db = SHOP.tracer.start_span("db", kind=SpanKind.CLIENT, start_time=t + 50 * MS)
        db.set_attribute("db.system.name", "postgresql")
        db.set_attribute("db.query.text", UPDATE)
        db.end(end_time=t + 400 * MS)
        root.end(end_time=t + 500 * MS)  # ends T0 + 10.4 s: closes at watermark T0 + 11.4 s
    p.spans(SHOP.take())
    out1 = p.tick(11.6)  # watermark T0 + 11.101 s: W0 closes, the slow trace is still open
    out2 = p.tick(12)  # watermark T0 + 11.501 s: the slow trace closes
    calls = [c for out in (out1, out2) for c in out.graph.calls if c["window"] == W0]
    assert [(c["caller"], c["callee"], c["count"]) for c in calls] == [("checkout", "postgresql", 1)]
    assert p.metric("trace_repro_dropped_total", component="calls", reason="calls_late") == 0


# ---- (c) late messages ----------------------------------------------------------------------------------------


def test_late_message_is_counted_and_kept_out_of_closed_window() -> None:
    """A message behind the watermark counts its spans as late; its trace misses the closed window."""
    p = Pipe()
    p.spans(request(5))
    out = p.tick(20)  # watermark T0 + 19.501 s: W0 closes
    assert [w["id"] for w in out.graph.windows] == [W0]
    late = request(3, statements=[(UPDATE, "('paid', 8812)")])  # 3 spans, all ending by T0 + 3.001 s
    out = p.spans(late)
    assert p.metric("trace_repro_late_events_total", kind="span") == 3
    assert closed_ids(out) == {trace_id(late)}  # assembled and written all the same
    assert p.metric("trace_repro_dropped_total", component="calls", reason="calls_late") == 1
    assert out.graph.calls == []


def test_span_for_a_closed_trace_reassembles_as_late_trace() -> None:
    """A span arriving after its trace closed is counted late and reassembled (idempotent writes)."""
    p = Pipe()
    spans = request(1, statements=[(UPDATE, "('paid', 8812)")])
    db, rest = spans[:1], spans[1:]
    p.spans(rest)
    out = p.tick(3)
    assert closed_ids(out) == {trace_id(spans)}
    out = p.spans(db)
    assert p.metric("trace_repro_late_events_total", kind="span") == 1
    assert p.metric("trace_repro_late_events_total", kind="trace") == 1
    assert closed_ids(out) == {trace_id(spans)}
    assert {r["id"] for r in out.graph.spans} == ids(db)[1]
    assert [k for k, _ in accesses(out, p.settings.kafka.accesses_topic)] == [b"orders:8812"]


# ---- (d) malformed messages -----------------------------------------------------------------------------------


def _bad(kind: str, p: Pipe) -> bytes | None:
    if kind == "truncated_proto":
        data = p.encode(request(1.5, statements=[(UPDATE, "('paid', 8812)")]))
        return data[: len(data) // 2]
    if kind == "empty":
        return b""
    if kind == "none":
        return None
    if kind == "json_garbage":
        return b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "0123'
    if kind == "json_wrong_shape":
        return b'{"resourceSpans": {"spans": 1}}'
    assert kind == "oversize_attribute"
    return p.encode(request(1.5, function="f" * 300))  # code.function.name of 300 bytes > 256


@pytest.mark.parametrize(
    ("kind", "encoding", "reason"),
    [
        ("truncated_proto", "otlp_proto", "otlp_proto_invalid"),
        ("empty", "otlp_proto", "empty_value"),
        ("none", "otlp_proto", "empty_value"),
        ("json_garbage", "otlp_json", "otlp_json_invalid"),
        ("json_wrong_shape", "otlp_json", "otlp_json_invalid"),
        ("oversize_attribute", "otlp_proto", "oversize_attribute"),
    ],
)
def test_malformed_message_goes_to_dlq_with_original_bytes(kind: str, encoding: str, reason: str) -> None:
    """A bad message becomes one dead letter (original key and bytes, reason and position headers); the good
    messages around it are processed."""
    p = Pipe(
        TRACE_REPRO_KAFKA__SPAN_ENCODING=encoding,
        TRACE_REPRO_DECODE__MAX_ATTRIBUTE_BYTES="256",
        TRACE_REPRO_DECODE__OVERSIZE="dlq",
    )  # oversize attributes are cut by default; dead-lettered on request
    good1, good2 = request(1), request(2)
    bad = _bad(kind, p)
    records = [
        p.record(p.encode(good1), key=b"k0"),
        p.record(bad, key=b"k1"),
        p.record(p.encode(good2), key=b"k2"),
    ]
    out = p.stage.process(records)
    [dead] = out.produce
    assert dead == Message(p.settings.kafka.dlq_topic, b"k1", bad, dead.headers)
    assert dead.value is bad  # the very bytes consumed
    headers = dict(dead.headers)
    assert headers["reason"] == reason.encode()
    assert headers["source.topic"] == SPANS.encode()
    assert headers["source.partition"] == b"0"
    assert headers["source.offset"] == b"1"
    assert headers["error"]
    assert p.metric("trace_repro_dlq_messages_total", reason=reason) == 1
    assert p.metric("trace_repro_dropped_total", component="decode", reason=reason) == 1
    assert p.metric("trace_repro_decoded_events_total", kind="span") == 4
    assert p.committable() == 0  # the good message at offset 0 feeds an open trace; the dead letter pins nothing
    out = p.tick(5)
    assert closed_ids(out) == {trace_id(good1), trace_id(good2)}
    # The batch's good messages (0, 2) were assembled as one run, which feeds its traces as its first message;
    # the dead letter (1) pinned nothing.
    assert out.release == [(TP, 0), (TP, 0)]


def test_malformed_row_change_goes_to_dlq() -> None:
    """A Debezium message that is not JSON is dead-lettered with its topic and position too."""
    p = Pipe()
    record = p.record(b"{not json", topic="shop.public.orders", partition=2, key=b'{"id": 1}')
    [dead] = p.stage.process([record]).produce
    headers = dict(dead.headers)
    assert (dead.topic, dead.key, dead.value) == (p.settings.kafka.dlq_topic, b'{"id": 1}', b"{not json")
    assert (headers["reason"], headers["source.topic"]) == (b"debezium_invalid_json", b"shop.public.orders")
    assert (headers["source.partition"], headers["source.offset"]) == (b"2", b"0")


# ---- (e) committable offsets ----------------------------------------------------------------------------------


def test_committable_waits_for_open_traces_and_windows() -> None:
    """Nothing past the oldest message feeding an open trace or window is committable until it is released."""
    p = Pipe()
    a = request(1, statements=[(UPDATE, "('paid', 8812)")])
    b = request(2.4)
    out = p.send(p.encode(a), p.encode(b))  # offsets 0, 1; watermark T0 + 1.901 s
    assert out.graph.traces == []
    assert p.committable() == 0
    out = p.tick(3.5)  # offset 2; watermark T0 + 3.001 s closes a only
    assert closed_ids(out) == {trace_id(a)}
    assert out.release == [(TP, 0)]
    assert p.committable() == 0  # not released yet
    p.stage.release(out.release)
    assert p.committable() == 0  # a's window W0 still holds offset 0

    out = p.tick(12)  # offset 3; watermark T0 + 11.501 s: b and the 3.5 s tick close, then W0
    assert [w["id"] for w in out.graph.windows] == [W0]
    assert p.committable() == 0
    p.stage.release(out.release)
    assert p.committable() == 3  # the 12 s tick is still an open trace

    p.clock.advance(30 + 20)  # no input for 50 s: event time follows the clock 20 s past the idle timeout
    out = p.send()
    assert len(out.graph.traces) == 1
    assert len(out.graph.windows) == 1
    assert p.committable() == 3
    p.stage.release(out.release)
    assert p.committable() == 4 == p.positions[TP]
    assert p.stage.tracker.pins.pinned(TP) == 0


def test_partitions_commit_independently() -> None:
    """An open trace on one partition does not hold back another partition's commit."""
    p = Pipe()
    p.send(p.encode(request(1)), partition=0)
    p.send(p.encode(request(1.2)), partition=1)
    assert (p.committable(0), p.committable(1)) == (0, 0)
    p.clock.advance(60)  # both idle: everything closes
    out = p.send()
    p.stage.release(out.release)
    assert (p.committable(0), p.committable(1)) == (1, 1)


def test_span_without_end_time_is_dead_lettered_and_pins_nothing() -> None:
    """A span whose end time is unset (0, so it ends before it starts) is never assembled: its message goes to
    the DLQ (clock_skew) with its bytes, it is counted, and its offset is committable at once."""
    p = Pipe()
    broken = SHOP.tracer.start_span("broken", start_time=T0 + S)
    broken.end(end_time=0)
    out = p.spans(SHOP.take())  # offset 0
    [dead] = out.produce
    assert dict(dead.headers)["reason"] == b"clock_skew"
    assert p.metric("trace_repro_dropped_total", component="clock", reason="absurd_duration") == 1
    assert len(p.stage.traces) == 0
    assert p.committable() == 1


# ---- (f) accesses ---------------------------------------------------------------------------------------------


def test_db_spans_become_accesses_keyed_by_entity() -> None:
    """Each DB span's row access goes to the accesses topic keyed by entity, with the handler's function."""
    p = Pipe()
    spans = request(1, statements=[(UPDATE, "('paid', 8812)"), (LOCK, "(8813,)")], function="capture_payment")
    assert p.spans(spans).produce == []  # nothing before the trace closes
    out = p.tick(5)
    found = accesses(out, p.settings.kafka.accesses_topic)
    assert [k for k, _ in found] == [b"orders:8812", b"orders:8813"]
    write, lock = (a for _, a in found)
    assert (write.entity, write.operation, write.lock) == ("orders:8812", DbOperation.WRITE, LockMode.NONE)
    assert (lock.entity, lock.operation, lock.lock) == ("orders:8813", DbOperation.READ, LockMode.FOR_UPDATE)
    assert write.params == ("paid", 8812)
    assert write.set_values == (("status", "paid"),)
    for a in (write, lock):
        assert (a.function, a.file) == ("capture_payment", "shop/app.py")
        assert (a.trace_id, a.service, a.version) == (trace_id(spans), "checkout", "1.0.0")
    db_ids = {format(s.context.span_id, "016x") for s in spans if s.name == "db" and s.context}
    assert {write.span_id, lock.span_id} == db_ids
    assert [r["entity"] for r in out.graph.writes] == ["orders:8812"]
    assert [r["entity"] for r in out.graph.reads] == ["orders:8813"]


def test_access_function_is_the_nearest_ancestor_that_has_one() -> None:
    """The function is taken from the nearest ancestor with code.function.name, skipping ancestors without."""
    p = Pipe()
    t = T0 + S
    tracer = SHOP.tracer
    with tracer.start_as_current_span("POST /x", kind=SpanKind.SERVER, start_time=t, end_on_exit=False) as server:
        server.set_attribute("code.function.name", "outer")
        with tracer.start_as_current_span("middleware", start_time=t + 1_000, end_on_exit=False) as middle:
            db = tracer.start_span("db", kind=SpanKind.CLIENT, start_time=t + 2_000)
            db.set_attribute("db.system.name", "postgresql")
            db.set_attribute("db.query.text", UPDATE)
            db.set_attribute("db.statement.parameters", "('paid', 7)")
            db.end(end_time=t + 3_000)
            middle.end(end_time=t + 4_000)
        server.end(end_time=t + 5_000)
    p.spans(SHOP.take())
    [(key, a)] = accesses(p.tick(5), p.settings.kafka.accesses_topic)
    assert (key, a.entity, a.function) == (b"orders:7", "orders:7", "outer")


# ---- bounds ---------------------------------------------------------------------------------------------------


def test_open_trace_bound_force_closes_and_counts() -> None:
    """Beyond max_open_traces the oldest trace is written early, counted, and its pins are released normally."""
    p = Pipe(TRACE_REPRO_WINDOWS__MAX_OPEN_TRACES="1")
    first, second = request(1), request(1.1)
    p.spans(first)
    out = p.spans(second)
    assert closed_ids(out) == {trace_id(first)}
    assert out.release == [(TP, 0)]
    assert p.metric("trace_repro_dropped_total", component="traces", reason="max_open_traces") == 1
    assert p.metric("trace_repro_open_traces") == 1
    p.stage.release(out.release)
    assert p.committable() == 0  # the forced trace's window still holds it
    p.clock.advance(60)
    out = p.send()
    p.stage.release(out.release)
    assert p.committable() == 2


def test_span_bound_drops_and_counts() -> None:
    """Spans beyond max_spans_per_trace are dropped and counted in the dropped metric."""
    p = Pipe(TRACE_REPRO_WINDOWS__MAX_SPANS_PER_TRACE="2")
    spans = request(1, statements=[(UPDATE, "('paid', 8812)")])  # 3 spans: db, handler, server
    p.spans(spans)
    assert p.metric("trace_repro_dropped_total", component="traces", reason="max_spans_per_trace") == 1
    out = p.tick(3)
    assert {r["id"] for r in out.graph.spans} == ids(spans[:2])[1]


# ---- replays --------------------------------------------------------------------------------------------------


def test_replay_after_revoke_and_reassign_pins_again() -> None:
    """After a partition is revoked and assigned back, the replayed message feeding an open trace is pinned again."""
    p = Pipe()
    data = p.encode(request(1, statements=[(UPDATE, "('paid', 8812)")]))
    p.send(data)  # offset 0
    assert p.committable() == 0
    p.stage.forget(TP)  # revoked ...
    p.positions[TP] = 0  # ... and assigned back: consumption resumes from the committed offset 0
    p.send(data)
    assert p.committable() == 0


def test_message_delivered_twice_counts_once() -> None:
    """The same spans delivered twice (at-least-once delivery) are one trace with each call counted once."""
    p = Pipe()
    data = p.encode(request(1, statements=[(UPDATE, "('paid', 8812)")]))
    p.send(data, data)
    out = p.tick(12)
    assert len(out.graph.spans) == 3
    assert [(c["caller"], c["callee"], c["count"]) for c in out.graph.calls] == [("checkout", "postgresql", 1)]


# ---- pins, whatever the order -----------------------------------------------------------------------------------


def _open_offsets(stage: IngestStage, fed: dict[str, set[tuple[tuple[str, int], int]]],
                  unflushed: dict[str, set[tuple[tuple[str, int], int]]],
                  root_start: dict[str, int]) -> dict[tuple[str, int], int]:  # fmt: skip
    """The oldest offset per partition that an open trace or open window still needs, from what the test sent:
    an open trace needs every message that carried its spans since it was last flushed (a trace evicted early by
    the open-trace bound is written as a fragment, and its later spans reopen it); an open CALLS window needs the
    messages of every trace whose root starts in it."""
    size = int(float(ENV["TRACE_REPRO_WINDOWS__WINDOW_S"]) * S)
    open_windows = set(stage.calls._windows._state)
    needed = [unflushed[t] for t in stage.traces._open]
    needed += [fed[t] for t, start in root_start.items() if start - start % size in open_windows]
    oldest: dict[tuple[str, int], int] = {}
    for sources in needed:
        for tp, offset in sources:
            oldest[tp] = min(offset, oldest.get(tp, offset))
    return oldest


requests_strategy = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=40),  # start, in 0.5 s steps
        st.integers(min_value=0, max_value=1),  # partition
        st.booleans(),  # split the trace into two messages
        st.booleans(),  # with a DB statement
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(requests_strategy, st.randoms(use_true_random=False), st.integers(min_value=1, max_value=4))
def test_commit_never_passes_a_message_still_needed(
    reqs: list[tuple[int, int, bool, bool]], rnd: random.Random, max_open: int
) -> None:
    """In any message order and batching, the committable offset never passes a message an open trace or window
    still needs, and once everything has closed and been released every position is committable."""
    IDS.reset()
    p = Pipe(TRACE_REPRO_WINDOWS__MAX_OPEN_TRACES=str(max_open))
    messages: list[tuple[int, bytes, str]] = []
    root_start: dict[str, int] = {}
    for half_s, partition, split, db in reqs:
        spans = request(half_s / 2, statements=[(UPDATE, "('paid', 8812)")] if db else [])
        tid = trace_id(spans)
        root_start[tid] = T0 + int(half_s / 2 * S)
        parts = [spans[:-1], spans[-1:]] if split else [spans]
        messages += [(partition, p.encode(part), tid) for part in parts]
    rnd.shuffle(messages)
    fed: dict[str, set[tuple[tuple[str, int], int]]] = defaultdict(set)
    unflushed: dict[str, set[tuple[tuple[str, int], int]]] = defaultdict(set)
    sent: dict[str, int] = {}
    while messages:
        size = rnd.randint(1, 3)
        batch, messages = messages[:size], messages[size:]
        records = [p.record(value, partition=partition) for partition, value, _ in batch]
        for record, (_, _, tid) in zip(records, batch, strict=True):
            fed[tid].add(record.source)
            unflushed[tid].add(record.source)
            sent[tid] = root_start[tid]
        out = p.stage.process(records)
        p.stage.release(out.release)
        for tid in [t for t in unflushed if t not in p.stage.traces._open]:
            del unflushed[tid]  # flushed (closed or evicted): its spans are in the graph rows this batch emitted
        for tid in closed_ids(out) & set(p.stage.traces._open):
            # Written in this batch and open again after it: evicted (or closed) between two of this batch's
            # messages and reopened by a later one. The messages before the flush went out with the fragment; which
            # those were is the stage's business, but the batch's last message of the trace came after it.
            [last] = [r.source for r, (_, _, t) in zip(records, batch, strict=True) if t == tid][-1:]
            unflushed[tid] = {last}
        for tp, oldest in _open_offsets(p.stage, fed, unflushed, sent).items():
            assert p.stage.committable(tp, p.positions[tp]) <= oldest
    p.clock.advance(30 + 100)
    out = p.send()
    p.stage.release(out.release)
    assert len(p.stage.traces) == len(p.stage.calls) == 0
    for tp, position in p.positions.items():
        assert p.stage.committable(tp, position) == position
        assert p.stage.tracker.pins.pinned(tp) == 0


@pytest.mark.parametrize("end_ns", [T0 + 2 * 86_400 * S, 2**62], ids=["two_days_ahead", "end_2_62"])
def test_a_span_from_a_clock_far_ahead_never_reaches_event_time(end_ns: int) -> None:
    """A host two days ahead (or a span ending at 2^62) is dropped and dead-lettered, counted; the watermark and the
    retention cut-off stay where the good spans put them, and every window still closes."""
    p = Pipe()
    bad = SHOP.tracer.start_span("future", start_time=end_ns - S)
    bad.end(end_time=end_ns)
    p.spans(SHOP.take())  # offset 0: the bad span alone
    good = p.tick(5)  # offset 1
    assert p.metric("trace_repro_dropped_total", component="clock", reason="future_time") == 1
    assert p.stage.watermarks.current() < T0 + 10 * S
    p.stage.release(good.release)
    out = p.tick(40)  # offset 2: the window of the tick closes
    assert len(out.graph.windows) == 1
    assert out.expire_before_ms is None or out.expire_before_ms < p.clock() / MS
    p.stage.release(out.release)
    assert p.committable() == 2


def test_low_watermark_is_published_to_every_internal_partition() -> None:
    """Stage 1 sends its low watermark (held back to the oldest open trace's start) for the spans partitions it
    owns into every partition of the internal topic, after the accesses it covers."""
    p = Pipe()
    p.stage.broadcast_partitions = 3
    p.stage.assign([(SPANS, 0), (SPANS, 1), ("shop.public.orders", 0)])
    p.clock.advance(31)  # spans partition 1 stays silent past the idle timeout: it stops holding the watermark back
    out = p.spans(request(10, statements=[(UPDATE, "('paid', 8812)")]))  # watermark T0 + 9.501 s
    topic = p.settings.kafka.accesses_topic
    marks = [(m.partition, wire.decode(m.value or b"")) for m in out.produce if m.topic == topic]
    assert [part for part, _ in marks] == [0, 1, 2]
    for _, mark in marks:
        assert isinstance(mark, wire.Watermark)
        assert mark.partitions == (f"{SPANS}/0", f"{SPANS}/1", "shop.public.orders/0")  # the row changes' too
        assert mark.watermark_ns == T0 + 9_501 * MS  # the watermark: the open trace started after it
    long = SHOP.tracer.start_span("GET /export", start_time=T0 + 12 * S)  # a long request, still open ...
    long.end(end_time=T0 + 19_200 * MS)
    out = p.spans(SHOP.take())  # watermark T0 + 18.7 s: the first request closes, the long one stays open
    decoded = [(m.partition, e) for m in out.produce if m.topic == topic for e in wire.decode_all(m.value or b"")]
    kinds = [type(event).__name__ for _, event in decoded]
    assert kinds == ["Access", "Watermark", "Watermark", "Watermark"]  # the closed trace's access comes first
    access = decoded[0][1]
    assert isinstance(access, Access) and decoded[0][0] == wire.partition_of(access.entity.encode(), 3)  # its row's
    mark = decoded[1][1]
    assert isinstance(mark, wire.Watermark) and mark.watermark_ns == T0 + 12 * S  # ... held back to its start


def test_a_newly_assigned_cdc_partition_holds_the_low_watermark_until_it_delivers_or_is_read_to_its_end() -> None:
    """A Debezium partition taken over replays row changes older than the traces already closed: until it delivers
    (or is read to its end and silent) the low watermark stage 2 judges by waits, so rows are not judged without
    their changes."""
    p = Pipe()
    p.stage.broadcast_partitions = 1
    cdc = ("shop.public.orders", 0)
    p.stage.assign([(SPANS, 0), cdc])
    p.stage.progress({(SPANS, 0)})  # the CDC partition has a backlog
    p.clock.advance(31)
    topic = p.settings.kafka.accesses_topic
    out = p.spans(request(10))
    [held] = [wire.decode(m.value or b"") for m in out.produce if m.topic == topic]
    assert isinstance(held, wire.Watermark) and held.watermark_ns == 0  # held at zero: stage 2 waits
    assert held.partitions == (f"{SPANS}/0", "shop.public.orders/0")
    p.stage.progress({(SPANS, 0), cdc})  # read to its end, and silent for the idle timeout since assigned
    p.clock.advance(1)  # while nothing is sent, at most one watermark a second
    out = p.spans(request(11))
    [mark] = [wire.decode(m.value or b"") for m in out.produce if m.topic == topic]
    assert isinstance(mark, wire.Watermark) and mark.watermark_ns == T0 + 10 * S  # the open trace's start
    assert mark.partitions == (f"{SPANS}/0", "shop.public.orders/0")


def test_partitions_taken_over_are_promised_at_what_they_replayed_not_at_this_instances_progress() -> None:
    """A worker that a rebalance hands a dead worker's spans partition publishes its promise as it is now, below
    what it promised before for its own partition: held at zero until the partition delivers, then at its replay's
    progress. (Stage 2 keeps each partition at the highest promise it got, so its own partition keeps its old one;
    its old promise sent for the new partition would let stage 2 judge rows before the replayed accesses.)"""
    p = Pipe()
    p.stage.broadcast_partitions = 1
    topic = p.settings.kafka.accesses_topic
    p.stage.assign([(SPANS, 0)])
    p.send(p.encode(request(30)), partition=0)
    p.clock.advance(11)
    before = [wire.decode(m.value or b"") for m in p.send(p.encode(request(40)), partition=0).produce]
    assert [m.watermark_ns for m in before if isinstance(m, wire.Watermark)] == [T0 + 39_501 * MS]
    p.stage.assign([(SPANS, 0), (SPANS, 1)])  # the dead worker's partition
    p.clock.advance(11)  # the heartbeat is due
    [held] = [wire.decode(m.value or b"") for m in p.stage.process([]).produce if m.topic == topic]
    assert isinstance(held, wire.Watermark) and held.partitions == (f"{SPANS}/0", f"{SPANS}/1")
    assert held.watermark_ns == 0  # the partition taken over has delivered nothing yet
    p.clock.advance(11)
    out = p.stage.process([p.record(p.encode(request(8)), partition=1)])  # its replay, from its last commit
    [mark] = [wire.decode(m.value or b"") for m in out.produce if m.topic == topic]
    assert isinstance(mark, wire.Watermark) and mark.watermark_ns == T0 + 7_501 * MS  # the replay's newest - lateness


def test_a_newly_assigned_partition_holds_event_time_back_until_it_delivers() -> None:
    """After a rebalance the partition taken over replays from its committed offset, behind the others: its traces
    must assemble whole, not close span by span as late against the other partitions' progress."""
    p = Pipe()
    p.stage.assign([(SPANS, 0)])
    p.send(p.encode(request(30)), partition=0)
    assert p.stage.event_time() == T0 + 30 * S + MS - 500 * MS  # partition 0's newest event - lateness
    p.stage.assign([(SPANS, 0), (SPANS, 1)])  # takes over partition 1
    assert p.stage.event_time() == 0  # held back until partition 1 delivers
    replayed = request(5, statements=[(UPDATE, "('paid', 8812)")])
    half = len(replayed) // 2
    out = p.stage.process([p.record(p.encode(replayed[:half]), partition=1)])
    assert closed_ids(out) == set() and p.metric("trace_repro_late_events_total", kind="span") == 0
    out = p.stage.process([p.record(p.encode(replayed[half:]), partition=1)])
    assert p.metric("trace_repro_late_events_total", kind="span") == 0
    out = p.stage.process([p.record(p.encode(request(31)), partition=1)])  # partition 1 moves past the trace
    [trace] = [r for r in out.graph.traces if r["id"] == trace_id(replayed)]
    assert (
        trace["rooted"]
        and trace["root"] != ""
        and len([s for s in out.graph.spans if s["trace"] == trace_id(replayed)]) == len(replayed)
    )


def test_a_closed_windows_statistics_are_relayed_to_stage_2_ahead_of_the_promise_that_covers_them() -> None:
    """With the daemon's components, a closed statistics window leaves as shares on the internal topic, all under
    the judge's key, before the low watermark that passes the window's end plus the trace gap (stage 2 tests the
    window once every instance has promised that much, so every share is ahead of it in its partition)."""
    p = Pipe()
    tracker = PinTracker()
    processors = stage_processors(p.settings, p.metrics, p.clock, "ingest", tracker, default().factories)
    p.stage = IngestStage(p.settings, p.metrics, p.clock, tracker=tracker, processors=processors)
    p.stage.broadcast_partitions = 2
    p.stage.assign([TP])
    p.spans(request(1) + request(2))
    assert not [m for m in p.tick(11.4).produce if m.key == KEY.encode()]  # watermark T0 + 10.901 s: W0 is open
    out = p.tick(11.5)  # watermark T0 + 11.001 s: W0 closes
    decoded = [(m.key, wire.decode(m.value or b"")) for m in out.produce if m.topic == p.settings.kafka.accesses_topic]
    assert [type(e).__name__ for _, e in decoded] == ["Relay", "Watermark", "Watermark"]
    key, share = decoded[0]
    assert isinstance(share, Relay) and (key, share.component) == (KEY.encode(), "regressions")
    body = share.body
    assert (body["start_ns"], body["end_ns"], body["part"], body["requests"]) == (T0, T0 + 10 * S, f"{SPANS}/0", 2)
    assert body["operation"] == "/orders/{id}/capture" and len(body["samples"]) == body["seen"] == 2
    mark = decoded[1][1]
    assert isinstance(mark, wire.Watermark) and mark.watermark_ns >= T0 + 11 * S


# ---- a batch's span messages assembled per partition run -----------------------------------------------------


def test_a_batch_of_two_partitions_assembles_each_run_with_its_own_offsets() -> None:
    """Span messages of two partitions interleaved in one batch: each trace holds the oldest offset of the
    partition that fed it (never the other partition's)."""
    p = Pipe()
    a, b, c = request(1), request(1.2), request(1.4)
    split = a[:-1], a[-1:]  # one trace over two messages of partition 0, around a message of partition 1
    out = p.stage.process([p.record(p.encode(split[0])), p.record(p.encode(b), partition=1),
                           p.record(p.encode(split[1])), p.record(p.encode(c), partition=1)])  # fmt: skip
    assert out.graph.traces == [] and len(p.stage.traces) == 3
    held = {tid: p.stage.tracker.held("traces", tid) for tid in p.stage.traces.open_ids()}
    assert held == {
        trace_id(a): {(TP, 0)},
        trace_id(b): {((SPANS, 1), 0)},
        trace_id(c): {((SPANS, 1), 1)},  # interleaved: each message is a run of its own
    }
    assert (p.committable(0), p.committable(1)) == (0, 0)
    p.stage.process([p.record(p.encode(request(1.6)), partition=1), p.record(p.encode(request(1.8)), partition=1)])
    new = set(p.stage.traces.open_ids()) - set(held)
    # Consecutive messages of a partition: one run, which feeds its traces as its first message.
    assert len(new) == 2 and {p.stage.tracker.held("traces", tid) for tid in new} == {frozenset({((SPANS, 1), 2)})}


def test_a_run_whose_assembly_raises_dead_letters_each_of_its_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Assembly failing for a run of messages (a bug) dead-letters every message of the run, with its bytes; the
    stage goes on with the next batch."""
    p = Pipe()
    first, second = p.encode(request(1)), p.encode(request(1.2))

    def raising(*_: object) -> None:
        raise RuntimeError("assembly")

    monkeypatch.setattr(type(p.stage.traces), "add", raising)
    out = p.stage.process([p.record(first), p.record(second)])
    assert [(m.topic, m.value) for m in out.produce] == [(p.settings.kafka.dlq_topic, v) for v in (first, second)]
    assert p.metric("trace_repro_dlq_messages_total", reason="internal_error:RuntimeError") == 2
    monkeypatch.undo()
    assert p.spans(request(2)).produce == []
