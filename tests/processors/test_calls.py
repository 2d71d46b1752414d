"""CallWindows: per-window CALLS aggregates from closed traces, closed on the watermark, holding their input."""

from __future__ import annotations

import math

from processors.graph.rows import window_rows
from processors.lib.parts import calls_total
from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.graph import GraphBatch
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.calls import CallWindows
from processors.state.windows import ClosedWindow
from streamer.runtime.pins import PinTracker

MS = 1_000_000
S = 1_000 * MS
SIZE = 10 * S
GRACE = 2 * S
T0 = 1_700_000_000 * S  # a multiple of SIZE
TP = ("otlp_spans", 0)
PG = DbCall(system="postgresql", statement="SELECT 1")


def span(
    sid: int,
    service: str,
    start_ns: int,
    dur_ms: float,
    *,
    parent: int = 0,
    kind: SpanKind = SpanKind.SERVER,
    db: DbCall | None = None,
    error: bool = False,
    trace: str = "a" * 32,
) -> Span:
    return Span(
        trace_id=trace,
        span_id=f"{sid:016x}",
        parent_id=f"{parent:016x}" if parent else "",
        name=f"op{sid}",
        kind=kind,
        start_ns=start_ns,
        end_ns=start_ns + int(dur_ms * MS),
        status=StatusCode.ERROR if error else StatusCode.UNSET,
        resource=Resource(service),
        db=db,
    )


class Traced(ClosedTrace):
    """A closed trace with the input offsets that fed it (what a window it lands in must hold)."""

    __slots__ = ("offsets",)

    def __init__(self, trace_id: str, spans: tuple[Span, ...], offsets: tuple[int, ...]) -> None:
        super().__init__(trace_id, spans)
        object.__setattr__(self, "offsets", offsets)


def closed(*spans: Span, offsets: tuple[int, ...] = (0,), trace_id: str = "a" * 32) -> Traced:
    return Traced(trace_id, spans, offsets)


class Windows(CallWindows):
    """CallWindows whose state reports to a PinTracker; each trace is added as the runtime does, inheriting the
    input its trace held."""

    def __init__(self, size: int, grace: int) -> None:
        self.pins = PinTracker()
        super().__init__(size, grace, events=self.pins)

    def add(self, trace: ClosedTrace) -> bool:
        current = self.pins._current = tuple((TP, o) for o in getattr(trace, "offsets", ()))
        self.pins._one = current[0] if len(current) == 1 else None  # (as ``PinTracker.inherit`` sets them)
        return super().add(trace)

    def sources(self, window: ClosedWindow[object]) -> frozenset[tuple[tuple[str, int], int]]:
        return self.pins.held("calls", window.start_ns)

    def new_pins(self, trace: ClosedTrace) -> set[tuple[tuple[str, int], int]] | None:
        """The input this trace made its window hold that it did not hold before (None: late)."""
        start = trace.root.start_ns - trace.root.start_ns % SIZE
        before = self.pins.held("calls", start)
        if not self.add(trace):
            return None
        return set(self.pins.held("calls", start) - before)


def shop_trace(
    start_ns: int, *, db_ms: float = 4.0, error: bool = False, offsets: tuple[int, ...] = (0,)
) -> ClosedTrace:
    """frontend → checkout (HTTP), checkout internal work, checkout → postgresql (DB client span)."""
    return closed(
        span(1, "frontend", start_ns, 50),
        span(2, "checkout", start_ns + 1 * MS, 40, parent=1, error=error),
        span(3, "checkout", start_ns + 2 * MS, 30, parent=2, kind=SpanKind.INTERNAL),
        span(4, "checkout", start_ns + 3 * MS, db_ms, parent=3, kind=SpanKind.CLIENT, db=PG),
        offsets=offsets,
    )


def test_calls_across_services_and_to_the_database() -> None:
    """A span whose parent is another service is one caller→callee call; a DB client span is service→db."""
    w = Windows(SIZE, GRACE)
    assert w.new_pins(shop_trace(T0 + S)) == {(TP, 0)}
    [window] = w.close_until(T0 + SIZE + GRACE)
    assert set(window.value[""]) == {("frontend", "checkout"), ("checkout", "postgresql")}
    http, db = window.value[""][("frontend", "checkout")], window.value[""][("checkout", "postgresql")]
    assert (http.count, http.errors) == (1, 0)
    assert (db.count, db.errors) == (1, 0)
    assert math.isclose(http.latency.quantile(0.5), 40, rel_tol=0.01)
    assert math.isclose(db.latency.quantile(0.5), 4, rel_tol=0.01)


def test_same_service_children_and_non_client_db_spans_are_not_calls() -> None:
    """Children in the parent's service are not calls; a DB span that is not a CLIENT span is not a DB call."""
    w = Windows(SIZE, GRACE)
    w.add(
        closed(
            span(1, "checkout", T0, 10),
            span(2, "checkout", T0, 5, parent=1, kind=SpanKind.INTERNAL),
            span(3, "checkout", T0, 1, parent=2, kind=SpanKind.INTERNAL, db=PG),
        )
    )
    [window] = w.close_until(T0 + SIZE + GRACE)
    assert window.value[""] == {}  # the trace's partition contributed no call


def test_db_system_missing_is_called_db() -> None:
    """A DB client span without a system name counts as a call to "db"."""
    w = Windows(SIZE, GRACE)
    w.add(closed(span(1, "checkout", T0, 10, kind=SpanKind.CLIENT, db=DbCall(system="", statement="SELECT 1"))))
    [window] = w.close_until(T0 + SIZE + GRACE)
    assert set(window.value[""]) == {("checkout", "db")}


def test_calls_and_errors_are_counted_per_window() -> None:
    """Traces are counted in the window their root starts in, each window separately, errors included."""
    w = Windows(SIZE, GRACE)
    w.add(shop_trace(T0 + 1 * S, error=True, offsets=(0,)))
    w.add(shop_trace(T0 + 9 * S, offsets=(1,)))
    w.add(shop_trace(T0 + SIZE + 1 * S, offsets=(2,)))
    assert len(w) == 2
    first, second = w.close_until(T0 + 2 * SIZE + GRACE)
    assert (first.start_ns, first.end_ns) == (T0, T0 + SIZE)
    assert first.value[""][("frontend", "checkout")].count == 2
    assert first.value[""][("frontend", "checkout")].errors == 1
    assert first.value[""][("checkout", "postgresql")].count == 2
    assert w.sources(first) == frozenset({(TP, 0)})  # the oldest input of the partition that fed it
    assert second.value[""][("frontend", "checkout")].count == 1
    assert w.sources(second) == frozenset({(TP, 2)})
    assert w._windows.telemetry.events["windows_closed"] == 2


def test_window_of_a_trace_is_its_roots_start() -> None:
    """A child whose clock runs early (starts before the window) does not move the trace out of its root's window."""
    w = Windows(SIZE, GRACE)
    root_start = T0 + SIZE + 1 * MS
    trace = closed(
        span(1, "frontend", root_start, 50),
        span(2, "checkout", root_start - 5 * MS, 40, parent=1),  # checkout's clock is 6 ms behind
    )
    w.add(trace)
    assert w.close_until(T0 + SIZE + GRACE) == []  # nothing in the earlier window
    [window] = w.close_until(T0 + 2 * SIZE + GRACE)
    assert window.start_ns == T0 + SIZE
    assert window.value[""][("frontend", "checkout")].count == 1


def test_window_closes_on_watermark_past_end_plus_grace() -> None:
    """A window closes when the watermark reaches its end plus the grace, not a nanosecond earlier."""
    w = Windows(SIZE, GRACE)
    w.add(shop_trace(T0 + S))
    assert w.close_until(T0 + SIZE + GRACE - 1) == []
    assert len(w) == 1
    [window] = w.close_until(T0 + SIZE + GRACE)
    t0_ms = T0 // MS
    assert window.window_id == f"{t0_ms}-{t0_ms + 10_000}"
    assert len(w) == 0
    assert w.close_until(T0 + 10 * SIZE) == []


def test_trace_for_a_closed_window_is_late() -> None:
    """A trace whose window has already closed is refused, counted late and changes nothing."""
    w = Windows(SIZE, GRACE)
    w.add(shop_trace(T0 + S, offsets=(0,)))
    [window] = w.close_until(T0 + SIZE + GRACE)
    assert w.add(shop_trace(T0 + 2 * S, offsets=(1,))) is False
    assert w.add(shop_trace(T0 - SIZE, offsets=(2,))) is False  # an even older window
    assert w._windows.telemetry.dropped["calls_late"] == 2
    assert len(w) == 0
    assert window.value[""][("frontend", "checkout")].count == 1
    assert w.new_pins(shop_trace(T0 + SIZE, offsets=(3,))) == {(TP, 3)}  # the next window is still open


def test_add_returns_only_sources_new_to_the_window() -> None:
    """A trace pins in its window only input older than what the window holds of that partition already."""
    w = Windows(SIZE, GRACE)
    assert w.new_pins(shop_trace(T0, offsets=(0, 1))) == {(TP, 0)}
    assert w.new_pins(shop_trace(T0 + S, offsets=(1, 2))) == set()
    assert w.new_pins(shop_trace(T0 + SIZE, offsets=(1,))) == {(TP, 1)}  # another window pins it separately


def test_p50_p95_come_from_the_latency_sketch() -> None:
    """p50/p95 of a call edge are the sketch's quantiles of the callee span durations, within 1%."""
    w = Windows(SIZE, GRACE)
    for i in range(1, 21):  # DB spans of 1 .. 20 ms
        w.add(shop_trace(T0 + i * 100 * MS, db_ms=float(i), offsets=(i,)))
    [window] = w.close_until(T0 + SIZE + GRACE)
    stats = window.value[""][("checkout", "postgresql")]
    assert stats.count == 20
    assert math.isclose(stats.latency.quantile(0.5), 10, rel_tol=0.01)  # sorted[floor(0.5 * 19)]
    assert math.isclose(stats.latency.quantile(0.95), 19, rel_tol=0.01)  # sorted[floor(0.95 * 19)]
    batch = GraphBatch()
    window_rows(window, batch)
    [row] = [r for r in batch.calls if (r["caller"], r["callee"]) == ("checkout", "postgresql")]
    assert (row["count"], row["errors"], row["window"], row["part"]) == (20, 0, window.window_id, "")
    total = calls_total([row])  # what the graph sink makes of the contributions
    assert math.isclose(total["p50_ms"], 10, rel_tol=0.01)
    assert math.isclose(total["p95_ms"], 19, rel_tol=0.01)
    assert batch.windows == [{"id": window.window_id, "start": T0 / MS, "end": (T0 + SIZE) / MS}]
