"""Synthetic request traffic for the performance detectors: a route calling a dependency, some calls hanging.

Spans are exported when they end, so :func:`assemble` feeds them in end-time order through the trace assembler
with the daemon's default ``[windows]`` settings, the watermark following the latest end: a hung request's early
children arrive long before its root, as they would from an OpenTelemetry SDK.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import s_to_ns
from processors.pipeline.traces import TraceAssembler
from processors.state.config import WindowConfig

MS = 1_000_000
S = 1_000 * MS
T0 = 1_800_000_000 * S  # a multiple of every window size used here
_ids = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Hop:
    """How one request's call to the dependency went: its duration, whether it failed (a client timeout) and
    whether the callee's server span was exported at all."""

    call_ms: float
    error: str = ""  # exception type on the client span ("": none)
    answered: bool = True


def request(at_ns: int, hop: Hop, *, route: str = "/checkout", callee: str = "inventory",
            version: str = "1.0", db_ms: float = 2.0) -> list[Span]:  # fmt: skip
    """One request of ``shop``: SERVER ``GET <route>`` -> handler -> a DB query, then ``GET /reserve`` on
    ``callee`` (its CLIENT span, and the callee's SERVER span unless it never answered)."""
    n = next(_ids)
    tid = f"{n:032x}"
    shop, dep = Resource("shop", version, "test", "rev"), Resource(callee, "2.0", "test", "rev")
    sid = (f"{n:012x}{i:04x}" for i in itertools.count(1))
    root_id, handler_id, db_id, call_id, server_id = (next(sid) for _ in range(5))
    db_start = at_ns + MS // 2
    call_start = db_start + int(db_ms * MS) + MS // 10
    call_end = call_start + int(hop.call_ms * MS)
    end = call_end + MS // 2
    failed = StatusCode.ERROR if hop.error else StatusCode.UNSET
    spans = [
        Span(tid, root_id, "", f"GET {route}", SpanKind.SERVER, at_ns, end, failed, shop, route=route,
             http_status=504 if hop.error else 200, exception_type=hop.error),
        Span(tid, handler_id, root_id, "checkout", SpanKind.INTERNAL, at_ns + MS // 4, end - MS // 4, failed, shop,
             code_function="shop.views.checkout", exception_type=hop.error),
        Span(tid, db_id, handler_id, "SELECT", SpanKind.CLIENT, db_start, db_start + int(db_ms * MS),
             StatusCode.UNSET, shop, db=DbCall("postgresql", "SELECT * FROM carts WHERE id = %s")),
        Span(tid, call_id, handler_id, "GET", SpanKind.CLIENT, call_start, call_end, failed, shop,
             exception_type=hop.error),
    ]  # fmt: skip
    if hop.answered:
        spans.append(Span(tid, server_id, call_id, "GET /reserve", SpanKind.SERVER, call_start + MS // 10,
                          call_end - MS // 10, StatusCode.UNSET, dep, route="/reserve", http_status=200))  # fmt: skip
    return spans


def route_traffic(windows: int, per_window: int, *, window_s: float = 60.0, call_ms: float = 20.0,
                  odd: Sequence[tuple[int, Hop]] = (), seed: int = 0) -> list[Span]:  # fmt: skip
    """``per_window`` requests spread over each of ``windows`` windows, calls of ``call_ms`` (±20 %); ``odd``
    replaces the hop of request ``i`` (counted over all windows) with the given one."""
    rng = random.Random(seed)
    special = dict(odd)
    step = int(window_s * S) // per_window
    out: list[Span] = []
    for i in range(windows * per_window):
        at = T0 + (i // per_window) * int(window_s * S) + (i % per_window) * step + rng.randrange(step // 2)
        out += request(at, special.get(i, Hop(call_ms * rng.uniform(0.8, 1.2))))
    return out


Step = tuple[int, list[ClosedTrace], "int | None"]


def assemble(spans: Sequence[Span], windows: WindowConfig | None = None) -> Iterator[Step]:
    """Feed ``spans`` in export (end-time) order, one per message; yield (watermark, traces it closed, start of
    the oldest trace still open) after each, and everything still open at the end (watermark past every deadline)."""
    w = windows or WindowConfig()
    asm = TraceAssembler(s_to_ns(w.trace_gap_s), w.max_open_traces, w.max_spans_per_trace,
                         max_request_ns=s_to_ns(w.max_request_s))  # fmt: skip
    ordered = sorted(spans, key=lambda s: s.end_ns)
    for span in ordered:
        asm.add([span])
        yield span.end_ns, asm.close_until(span.end_ns), asm.oldest_start()
    last = ordered[-1].end_ns + s_to_ns(w.max_request_s) + s_to_ns(w.trace_gap_s) + S
    yield last, asm.close_until(last), None


def load_traffic(rates: Sequence[float], *, window_s: float = 60.0, hold_ms: float = 30.0, lock: bool = True,
                 slower: Sequence[float] = (), seed: int = 0) -> list[Span]:  # fmt: skip
    """``payments`` serving ``POST /pay`` at ``rates[i]`` requests/s (Poisson) in window ``i``; each request does
    5 ms of work, then ``hold_ms`` in a critical section, then 5 ms. With ``lock`` the critical sections queue for
    one lock (latency rises with the requests in flight); without, they run side by side. ``slower[i]`` multiplies
    window ``i``'s latency (a slower build: more in flight by Little's law, no lock)."""
    rng = random.Random(seed)
    res = Resource("payments", "1.0", "test", "rev")
    out: list[Span] = []
    lock_free = 0
    for i, rate in enumerate(rates):
        factor = slower[i] if i < len(slower) else 1.0
        t = T0 + int(i * window_s * S)
        end_window = t + int(window_s * S)
        while True:
            t += int(rng.expovariate(rate) * S)
            if t >= end_window:
                break
            hold = int(hold_ms * MS * rng.uniform(0.8, 1.2) * factor)
            enter = t + 5 * MS
            if lock:
                enter = max(enter, lock_free)
                lock_free = enter + hold
            end = enter + hold + 5 * MS
            n = next(_ids)
            tid = f"{n:032x}"
            root = Span(tid, f"{n:012x}0001", "", "POST /pay", SpanKind.SERVER, t, end, StatusCode.UNSET, res,
                        route="/pay", http_status=200)  # fmt: skip
            out += [root, Span(tid, f"{n:012x}0002", root.span_id, "charge", SpanKind.INTERNAL, enter, enter + hold,
                               StatusCode.UNSET, res, code_function="payments.views.charge")]  # fmt: skip
    return out
