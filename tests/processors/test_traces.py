"""TraceAssembler: event-time trace assembly, closed by the watermark, bounded in traces and spans."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import pytest

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.sizes import span_bytes
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline import traces
from processors.pipeline.traces import TraceAssembler
from streamer.runtime.pins import PinTracker

S = 1_000_000_000
GAP = 2 * S
TP = ("otlp_spans", 0)
A = "a" * 32
B = "b" * 32
C = "c" * 32


def span(trace: str, sid: int, start_s: float, end_s: float, parent: int = 0, service: str = "checkout") -> Span:
    return Span(
        trace_id=trace,
        span_id=f"{sid:016x}",
        parent_id=f"{parent:016x}" if parent else "",
        name=f"op{sid}",
        kind=SpanKind.SERVER if not parent else SpanKind.INTERNAL,
        start_ns=int(start_s * S),
        end_ns=int(end_s * S),
        status=StatusCode.UNSET,
        resource=Resource(service),
    )


def src(offset: int) -> tuple[tuple[str, int], int]:
    return (TP, offset)


class _Recording(PinTracker):
    """A PinTracker that also records each (input, key) the assembler retained: the references it takes."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: set[tuple[object, str, object]] = set()

    def retained(self, store: str, key: Hashable) -> None:
        self.taken.update((source, store, key) for source in self._current)
        super().retained(store, key)


class Assembler(TraceAssembler):
    """A TraceAssembler whose keyed state reports to a PinTracker, fed one message (offset) at a time."""

    def __init__(self, gap: int, *, max_open: int, max_spans: int, remember_closed: int = 100_000,
                 max_bytes: int | None = None) -> None:  # fmt: skip
        self.pins = _Recording()
        super().__init__(gap, max_open, max_spans, remember_closed, max_bytes=max_bytes, events=self.pins)

    def feed(self, spans: Iterable[Span], offset: int) -> tuple[list[ClosedTrace], int]:
        """The traces forced closed, and how many traces took this message as a new input (pins it)."""
        before = self._references()
        self.pins.feeding(src(offset))
        forced = self.add(spans)
        return forced, self._references() - before

    def _references(self) -> int:
        return len(self.pins.taken)

    def sources(self, trace: ClosedTrace) -> frozenset[tuple[tuple[str, int], int]]:
        """The input the trace held (pinned until it closed)."""
        return self.pins.held("traces", trace.trace_id)


def only(closed: list[ClosedTrace]) -> ClosedTrace:
    assert len(closed) == 1
    return closed[0]


def test_trace_closes_only_when_watermark_reaches_last_end_plus_gap() -> None:
    """A trace stays open until the watermark is at least its last span's end plus the gap."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101), span(A, 2, 100.5, 100.8, parent=1)], 0)
    assert asm.close_until(103 * S - 1) == []
    assert len(asm) == 1
    trace = only(asm.close_until(103 * S))
    assert trace.trace_id == A
    assert {s.span_id for s in trace.spans} == {f"{1:016x}", f"{2:016x}"}
    assert asm.sources(trace) == frozenset({src(0)})
    assert (trace.late, trace.forced) == (False, False)
    assert (trace.start_ns, trace.end_ns) == (100 * S, 101 * S)
    assert trace.root.span_id == f"{1:016x}"
    assert len(asm) == 0
    assert asm.telemetry.events["closed"] == 1
    assert asm.close_until(10_000 * S) == []  # closed once only


def test_closing_closes_each_trace_as_it_is_taken() -> None:
    """``closing`` hands the due traces over one at a time, earliest deadline first: a trace not taken yet is still
    open (a burst's spans go as their traces are done, not all held until the last is)."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101), span(B, 2, 100, 102), span(C, 3, 100, 150)], 0)
    closing = asm.closing(110 * S)
    assert len(asm) == 3
    assert next(closing).trace_id == A and len(asm) == 2
    assert next(closing).trace_id == B and len(asm) == 1
    assert next(closing, None) is None and asm.open_ids() == [C]


def test_a_spread_close_stops_at_its_budget_and_leaves_the_rest_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """``closing(spread=True)`` closes the spans added since the last such call and ``SPREAD_SPANS`` more: the due
    traces past that stay open and close at the next calls (none is lost from the deadlines)."""
    monkeypatch.setattr(traces, "SPREAD_SPANS", 2)
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101), span(A, 2, 100, 101, parent=1), span(B, 3, 100, 102),
              span(B, 4, 100, 102, parent=3), span(C, 5, 100, 103)], 0)  # fmt: skip
    assert list(asm.closing(100 * S, spread=True)) == [] and len(asm) == 3  # none due; the 5 spans added counted
    assert [t.trace_id for t in asm.closing(110 * S, spread=True)] == [A] and len(asm) == 2
    assert [t.trace_id for t in asm.closing(110 * S, spread=True)] == [B]
    assert [t.trace_id for t in asm.closing(110 * S, spread=True)] == [C] and len(asm) == 0
    asm.feed([span("d" * 32, 6, 100, 101), span("e" * 32, 7, 100, 101), span("f" * 32, 8, 100, 101)], 1)
    assert len(list(asm.closing(110 * S, spread=True))) == 3  # what was added since, and 2 more
    assert asm.telemetry.events["closed"] == 6


def test_later_span_extends_the_deadline() -> None:
    """A span ending later pushes the trace's deadline out; the stale earlier deadline closes nothing."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101)], 0)
    asm.feed([span(A, 2, 102, 104, parent=1)], 1)
    assert asm.close_until(103 * S) == []  # the first span's deadline has passed, the trace's has not
    assert asm.close_until(106 * S - 1) == []
    trace = only(asm.close_until(106 * S))
    assert len(trace.spans) == 2
    assert asm.sources(trace) == frozenset({src(0)})  # the oldest input of its partition


def test_earlier_ending_span_does_not_shorten_the_deadline() -> None:
    """A span that ends before the trace's latest end leaves the deadline where it was."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 110)], 0)
    asm.feed([span(A, 2, 100.1, 100.2, parent=1)], 1)
    assert asm.close_until(112 * S - 1) == []
    assert len(only(asm.close_until(112 * S)).spans) == 2


def test_out_of_order_spans_assemble_one_trace() -> None:
    """Children arriving before their parent (and grandchildren before children) still form one trace."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 3, 100.2, 100.3, parent=2)], 0)
    asm.feed([span(A, 2, 100.1, 100.6, parent=1)], 1)
    asm.feed([span(A, 1, 100, 101)], 2)
    trace = only(asm.close_until(200 * S))
    assert [s.span_id for s in trace.spans] == [f"{3:016x}", f"{2:016x}", f"{1:016x}"]  # arrival order
    assert trace.root.span_id == f"{1:016x}"
    assert trace.start_ns == 100 * S
    assert asm.sources(trace) == frozenset({src(0)})


def test_root_missing_falls_back_to_earliest_span() -> None:
    """Without a root span, the trace's root is its earliest span."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 3, 100.5, 100.6, parent=9), span(A, 2, 100.2, 100.3, parent=9)], 0)
    assert only(asm.close_until(200 * S)).root.span_id == f"{2:016x}"


def test_traces_close_independently_in_deadline_order() -> None:
    """Several open traces close each at its own deadline."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101), span(B, 2, 100, 105), span(C, 3, 100, 103)], 0)
    assert [t.trace_id for t in asm.close_until(105 * S)] == [A, C]
    assert [t.trace_id for t in asm.close_until(107 * S)] == [B]


def test_max_open_force_closes_the_oldest_and_counts_it() -> None:
    """Opening a trace beyond max_open closes the oldest open trace early, marked forced and counted."""
    asm = Assembler(GAP, max_open=2, max_spans=10)
    assert asm.feed([span(A, 1, 100, 101)], 0) == ([], 1)
    assert asm.feed([span(B, 2, 102, 103)], 1) == ([], 1)
    forced, refs = asm.feed([span(C, 3, 104, 105)], 2)
    assert refs == 1
    trace = only(forced)
    assert (trace.trace_id, trace.forced, trace.late) == (A, True, False)
    assert asm.sources(trace) == frozenset({src(0)})
    assert asm.telemetry.dropped["max_open_traces"] == 1
    assert len(asm) == 2
    assert [t.trace_id for t in asm.close_until(1_000 * S)] == [B, C]
    assert asm.telemetry.events["closed"] == 3


def test_max_spans_drops_excess_spans_and_counts_them() -> None:
    """Spans beyond max_spans per trace are dropped and counted; the kept ones still close normally."""
    asm = Assembler(GAP, max_open=10, max_spans=2)
    asm.feed([span(A, 1, 100, 101), span(A, 2, 100, 100.5, parent=1)], 0)
    forced, refs = asm.feed([span(A, 3, 100, 150, parent=1), span(A, 4, 100, 100.2, parent=1)], 1)
    assert (forced, refs) == ([], 0)  # nothing kept from offset 1: no new reference to pin
    assert asm.telemetry.dropped["max_spans_per_trace"] == 2
    assert asm.telemetry.events["spans"] == 2
    trace = only(asm.close_until(103 * S))  # the dropped span's later end did not extend the deadline
    assert [s.span_id for s in trace.spans] == [f"{1:016x}", f"{2:016x}"]
    assert asm.sources(trace) == frozenset({src(0)})


def db_span(trace: str, sid: int, start_s: float, statement: str) -> Span:
    """A database client span whose statement text is ``statement``."""
    base = span(trace, sid, start_s, start_s + 0.01, parent=1)
    return Span(base.trace_id, base.span_id, base.parent_id, "UPDATE", SpanKind.CLIENT, base.start_ns, base.end_ns,
                base.status, base.resource, db=DbCall("postgresql", statement))  # fmt: skip


def test_max_bytes_closes_the_least_recently_fed_traces_early_and_counts_them() -> None:
    """Traces whose spans carry megabyte statements: the open traces' accounted size never passes the byte bound;
    the least recently fed are closed early (forced, with all their spans and the input they held) and
    counted; nothing is lost, and a trace alone over the bound closes with the span that took it there."""
    mib = 1 << 20
    asm = Assembler(GAP, max_open=1_000, max_spans=100, max_bytes=4 * mib)
    big = "UPDATE orders SET note = '" + "x" * mib + "' WHERE id = 1"
    fed, closed = 0, []
    for i in range(12):  # 12 traces, 2 megabyte spans each: 24 MiB fed against a 4 MiB bound
        trace = f"{i:032x}"
        forced, _ = asm.feed([span(trace, 1, 100 + i, 101 + i), db_span(trace, 2, 100 + i, big)], i)
        forced += asm.feed([db_span(trace, 3, 100.5 + i, big)], 100 + i)[0]
        fed += 3
        closed += forced
        assert asm.bytes <= 4 * mib
        assert all(t.forced for t in forced)
    assert asm.telemetry.dropped["max_open_trace_bytes"] == len(closed) > 0
    assert asm.telemetry.dropped["max_open_traces"] == 0
    closed += asm.close_all()
    assert sum(len(t.spans) for t in closed) == fed  # closed early, not lost
    assert asm.bytes == 0
    assert asm.sources(closed[0]) == frozenset({src(0)})  # the input it held goes with it

    alone = Assembler(GAP, max_open=10, max_spans=100, max_bytes=2 * mib)
    alone.feed([span(A, 1, 100, 101), db_span(A, 2, 100, big)], 0)
    forced, _ = alone.feed([db_span(A, 3, 100.5, big)], 1)
    assert [len(t.spans) for t in forced] == [3] and alone.bytes == 0


def test_a_byte_bound_leaves_ordinary_traces_as_they_were() -> None:
    """Under a byte bound that ordinary spans stay far below, assembly is exactly what it is without one."""

    def run(max_bytes: int | None) -> tuple[list[tuple[str, int, bool]], dict[str, int]]:
        asm = Assembler(GAP, max_open=100, max_spans=100, max_bytes=max_bytes)
        for i in range(50):
            trace = f"{i:032x}"
            asm.feed([span(trace, 1, 100 + i / 10, 101 + i / 10), db_span(trace, 2, 100 + i / 10, "SELECT 1")], i)
        out = [(t.trace_id, len(t.spans), t.forced) for t in asm.close_until(200 * S)]
        return out, {k: v for k, v in asm.telemetry.dropped.items() if v}

    assert run(1 << 20) == run(None)
    assert run(1 << 20)[1] == {}
    assert span_bytes(db_span(A, 2, 100, "SELECT 1")) < 1_000 < span_bytes(db_span(A, 2, 100, "x" * 1_000))


def test_span_for_recently_closed_trace_is_late_and_reassembled() -> None:
    """A span arriving after its trace closed reopens it as a late trace, which closes again on the watermark."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101)], 0)
    assert not only(asm.close_until(110 * S)).late
    asm.pins.take_released()  # the batch that closed it is durable
    forced, refs = asm.feed([span(A, 2, 100.2, 100.4, parent=1)], 5)
    assert (forced, refs) == ([], 1)
    assert asm.telemetry.events["late_spans"] == 1
    assert len(asm) == 1
    again = only(asm.close_until(110 * S))  # its deadline (100.4 + 2) is already behind the watermark
    assert again.late
    assert [s.span_id for s in again.spans] == [f"{2:016x}"]
    assert asm.sources(again) == frozenset({src(5)})


def test_forgotten_closed_trace_is_not_late() -> None:
    """Only the last ``remember_closed`` closed trace ids are remembered for late detection."""
    asm = Assembler(GAP, max_open=10, max_spans=10, remember_closed=1)
    asm.feed([span(A, 1, 100, 101), span(B, 2, 100, 102)], 0)
    assert [t.trace_id for t in asm.close_until(110 * S)] == [A, B]
    asm.feed([span(A, 3, 100, 101, parent=1), span(B, 4, 100, 101, parent=2)], 1)
    closed = {t.trace_id: t.late for t in asm.close_until(120 * S)}
    assert closed == {A: False, B: True}


def test_new_refs_count_each_open_trace_taking_a_source_once() -> None:
    """add() returns one new reference per trace that takes the message as a new input, not one per span."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    _, refs = asm.feed([span(A, 1, 100, 101), span(A, 2, 100, 101, parent=1), span(B, 3, 100, 101)], 0)
    assert refs == 2  # A and B
    _, refs = asm.feed([span(A, 4, 100, 101, parent=1)], 0)  # same message again (e.g. a re-add)
    assert refs == 0
    _, refs = asm.feed([span(A, 5, 100, 101, parent=1), span(C, 6, 100, 101)], 1)
    assert refs == 2  # A takes offset 1 as a new input, C is new
    _, refs = asm.feed([], 2)
    assert refs == 0


def test_forced_close_and_reference_in_same_message_balance() -> None:
    """A message whose first span extends the trace that its second span's trace then forces closed is counted
    once for each trace; the forced trace holds the oldest input of the partition, the other trace the message."""
    asm = Assembler(GAP, max_open=1, max_spans=10)
    asm.feed([span(A, 1, 100, 101)], 0)
    forced, refs = asm.feed([span(A, 2, 100, 101.5, parent=1), span(B, 3, 101, 102)], 1)
    assert refs == 2
    assert asm.sources(only(forced)) == frozenset({src(0)})
    assert asm.sources(only(asm.close_until(1_000 * S))) == frozenset({src(1)})


def test_span_without_end_time_still_closes() -> None:
    """A span whose end time is 0 (unset in the OTLP message) does not keep its trace open forever."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 0, 0)], 0)
    assert only(asm.close_until(1_000 * S)).trace_id == A
    assert len(asm) == 0


def test_max_open_with_trace_lacking_end_time_does_not_crash() -> None:
    """The open-trace bound can force-close a trace whose only span has no end time."""
    asm = Assembler(GAP, max_open=1, max_spans=10)
    asm.feed([span(A, 1, 0, 0)], 0)
    forced, refs = asm.feed([span(B, 2, 100, 101)], 1)
    assert (only(forced).trace_id, refs) == (A, 1)


def test_close_all_closes_everything_open() -> None:
    """close_all() (shutdown) returns every open trace regardless of the watermark."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    asm.feed([span(A, 1, 100, 101), span(B, 2, 100, 101)], 0)
    assert {t.trace_id for t in asm.close_all()} == {A, B}
    assert len(asm) == 0
    assert asm.close_until(10_000 * S) == []


def test_a_request_longer_than_the_gap_is_one_trace() -> None:
    """A handler's children end (and are exported) 30 s before its root: the trace waits for the root, not the gap."""
    asm = TraceAssembler(GAP, 10, 10, max_request_ns=120 * S)
    asm.add([span(A, 3, 100.1, 100.2, parent=2), span(A, 2, 100.05, 100.3, parent=1)])
    assert asm.close_until(125 * S) == []  # quiet far longer than the gap, but span 1 (its parent) is running
    asm.add([span(A, 1, 100, 130)])  # the root ends after a 30 s hang
    assert asm.close_until(131 * S) == []
    trace = only(asm.close_until(132 * S))
    assert sorted(s.span_id for s in trace.spans) == [f"{i:016x}" for i in (1, 2, 3)]
    assert trace.root.span_id == f"{1:016x}" and not trace.late
    assert asm.telemetry.dropped["max_request_duration"] == 0


def test_a_parent_that_never_comes_closes_at_the_request_bound_counted() -> None:
    """An awaited parent holds the trace at most ``max_request`` after its start; that close is counted."""
    asm = TraceAssembler(GAP, 10, 10, max_request_ns=60 * S)
    asm.add([span(A, 2, 100, 100.5, parent=1)])
    assert asm.close_until(160 * S - 1) == []
    assert [s.span_id for s in only(asm.close_until(160 * S)).spans] == [f"{2:016x}"]
    assert asm.telemetry.dropped["max_request_duration"] == 1


def test_a_server_span_with_a_missing_remote_parent_closes_after_the_gap() -> None:
    """A SERVER span's parent is a caller in another process, which may never report: the gap alone closes it."""
    asm = TraceAssembler(GAP, 10, 10, max_request_ns=60 * S)
    entry = Span(A, f"{2:016x}", f"{9:016x}", "GET /", SpanKind.SERVER, 100 * S, 101 * S, StatusCode.UNSET,
                 Resource("checkout"))  # fmt: skip
    asm.add([entry, span(A, 3, 100.1, 100.9, parent=2)])
    assert len(only(asm.close_until(103 * S)).spans) == 2


def test_a_trace_that_lost_spans_to_the_bound_awaits_no_parent() -> None:
    """The awaited parent may be a span dropped at ``max_spans``: a truncated trace closes after the gap."""
    asm = TraceAssembler(GAP, 10, 2, max_request_ns=120 * S)
    asm.add([span(A, 3, 100.1, 100.2, parent=2), span(A, 2, 100.05, 100.3, parent=1), span(A, 1, 100, 100.4)])
    assert len(only(asm.close_until(int(102.4 * S))).spans) == 2
    assert asm.telemetry.dropped["max_request_duration"] == 0


def test_a_trace_that_lost_spans_before_assembly_awaits_no_parent() -> None:
    """Spans dropped before assembly (unreadable, absurd times) may be the parent awaited: ``lost`` closes the
    trace after the gap, whether it was open then or opens later."""
    asm = TraceAssembler(GAP, 10, 10, max_request_ns=120 * S)
    asm.add([span(A, 3, 100.1, 100.2, parent=2)])
    asm.lost([A, B])
    asm.add([span(B, 4, 100.1, 100.2, parent=2)])
    assert {t.trace_id for t in asm.close_until(int(102.2 * S))} == {A, B}


def test_a_trace_over_several_messages_holds_one_copy_of_its_id() -> None:
    """Spans of one trace decoded from different messages carry equal, separate id strings: once assembled they
    hold one (the trace's first), and still compare and hash as before."""
    asm = Assembler(GAP, max_open=10, max_spans=10)
    first, second = span(A, 1, 100, 101), span("".join(A), 2, 100.2, 100.4, parent=1)
    assert first.trace_id == second.trace_id and first.trace_id is not second.trace_id
    before = hash(second)
    asm.feed([first], 0)
    asm.feed([second], 1)
    trace = only(asm.close_until(200 * S))
    assert all(s.trace_id is first.trace_id for s in trace.spans)
    assert hash(second) == before and second == span(A, 2, 100.2, 100.4, parent=1)


def test_the_oldest_start_is_the_earliest_span_of_an_open_trace_whatever_order_its_spans_come_in() -> None:
    asm = TraceAssembler(GAP, max_open=10, max_spans=100)
    # Children first, each parent starting earlier (as exporters send them); two traces in one message.
    asm.add(
        [span(A, 3, 3.0, 3.5, parent=2), span(B, 1, 2.5, 9.0), span(A, 2, 2.0, 4.0, parent=1), span(A, 1, 1.0, 5.0)]
    )
    assert asm.oldest_start() == 1 * S
    asm.add([span(B, 2, 1.5, 2.0, parent=1)])  # a later message starts B earlier
    assert asm.oldest_start() == 1 * S
    assert [t.trace_id for t in asm.close_until(8 * S)] == [A]
    assert asm.oldest_start() == int(1.5 * S)
    asm.close_until(12 * S)
    assert asm.oldest_start() is None


def test_a_trace_closed_by_the_bound_and_opened_again_in_one_message_starts_at_its_new_spans() -> None:
    asm = TraceAssembler(GAP, max_open=1, max_spans=100)
    forced = asm.add([span(A, 2, 2.0, 3.0, parent=1), span(B, 1, 5.0, 6.0), span(A, 1, 1.0, 4.0)])
    assert [t.trace_id for t in forced] == [A, B]  # B made A close early, A's root then made B close
    assert asm.oldest_start() == 1 * S
