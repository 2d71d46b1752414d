"""The per-trace paths of the hang, fan-out and contention detectors against the logic they replaced.

Each detector's ``on_trace`` was rewritten to do less per call (issue 37: one pass, no object per call). The
previous logic is kept here, as a subclass overriding ``on_trace`` (the rest of the detector is shared), and both
are fed the same random traces (odd ones too: parent cycles, repeated and empty span ids, missing parents, errors,
timeouts, 429/5xx, DB calls) under tight bounds, watermarks moving on as they go. After every step their whole state
must be equal: open windows, counters, drop counters, learned callees, recent distributions, the random generator,
and every finding they emit. The helpers the detectors share (``failed``, ``dependency_of``, ``operation_of``, the
hang detector's operations) read a span's detail: they are checked on hand-built spans, on spans whose detail is
read and on lazy ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from processors.api.component import Emit, Processor
from processors.api.telemetry import Telemetry
from processors.detectors.contention import ContentionConfig
from processors.detectors.contention.detector import ContentionDetector, _Requests
from processors.detectors.fanout import FanoutConfig, FanoutDetector
from processors.detectors.hangs import HangConfig, HangDetector
from processors.detectors.hangs.detector import _keep
from processors.detectors.hangs.finding import HopWindow
from processors.detectors.hangs.hops import operation_of as hop_operation
from processors.detectors.hangs.hops import timed_out
from processors.findings.trace_windows import Shapes, dependency_of, failed, operation_of
from processors.model.events import Access, DbCall, Resource, SpanKind, StatusCode
from processors.model.span import LazySpan, Span, SpanDetail, lazy_span
from processors.model.trace import ClosedTrace
from processors.pipeline.requests import requests_of
from processors.state.config import WindowConfig

MS = 1_000_000
S = 1_000 * MS
T0 = 1_800_000_000 * S
WINDOWS = WindowConfig(window_s=2.0, trace_gap_s=1.0, max_windows=5)
WIDE = WindowConfig(window_s=20.0, trace_gap_s=1.0, max_windows=5)  # (contention: max_requests is 100 at least)

# ---- the previous logic -------------------------------------------------------------------------------------------


def _ref_operation(span: Span, by_id: dict[str, Span]) -> str:
    service, node, seen = span.resource.service, span, 0
    while seen < 64:
        parent = by_id.get(node.parent_id)
        if parent is None or parent.resource.service != service:
            return node.route or node.name
        if parent.kind == SpanKind.SERVER or not parent.parent_id:
            return parent.route or parent.name
        node, seen = parent, seen + 1
    return node.route or node.name


class RefHangs(HangDetector):
    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        facts = trace.facts
        calls: list[tuple[Any, ...]] = []
        if facts.clients:
            by_id = facts.by_id
            answered: dict[str, str] = {}
            for s in facts.servers.values() if "" not in by_id else trace.spans:
                if s.kind == SpanKind.SERVER and s.parent_id in by_id:
                    answered[s.parent_id] = s.resource.service
            for span in facts.clients:
                service = span.resource.service
                callee = answered.get(span.span_id)
                db = span.db
                answer = callee is not None or db is not None
                if callee:
                    self._learned.put((service, span.name), callee)
                else:
                    callee = db.system if db is not None else self._learned.get((service, span.name)) or span.name
                hop = (service, _ref_operation(span, by_id), callee)
                error = span.is_error
                calls.append(
                    (hop, span.resource.version, span.start_ns, span.end_ns, error, error and timed_out(span), answer)
                )
        if not calls:
            return
        parts = self._windows.at(trace.root.start_ns)
        if parts is None:
            return
        hops = parts.setdefault(trace.part, {})
        per_window = self.config.per_window
        floor_ms = self.config.min_hang_s * 1e3
        for hop, version, start_ns, end_ns, error, timeout, answer in calls:
            w = hops.get(hop)
            if w is None:
                w = hops[hop] = HopWindow(version=version)
            w.calls += 1
            ms = (end_ns - start_ns) / 1e6
            if timeout:
                w.timeout_seen = True
                if not answer:
                    w.timeout_count += 1
                    _keep(w.timeouts, (ms, start_ns, trace.trace_id))
                continue
            if not error:
                judged = self._thresholds.get(hop)
                if judged is not None and ms > judged[0]:
                    w.hung_count += 1
                    w.threshold_ms = judged[0]
                    _keep(w.hung, (ms, start_ns, trace.trace_id))
                    continue
                if judged is None and ms > floor_ms:
                    if len(w.pending) < per_window:
                        w.pending.append((ms, start_ns, trace.trace_id))
                        continue
                    self.telemetry.drop("unjudged")
            if len(w.durations) < per_window:
                w.durations.append(ms)
            else:
                j = self._rng.randrange(w.calls)
                if j < per_window:
                    w.durations[j] = ms


class RefFanout(FanoutDetector):
    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        part = self.windows.window(trace)
        if part is None:
            return
        facts = trace.facts
        if len(facts.clients) < self.config.min_calls:
            return
        by_parent: dict[str, list[Span]] = {}
        for s in facts.clients:
            by_parent.setdefault(s.parent_id, []).append(s)
        wide = [group for group in by_parent.values() if len(group) >= self.config.min_calls]
        paths: dict[str, dict[str, int]] = {}
        for group in wide:
            by_target: dict[tuple[str, str], list[Span]] = {}
            for s in group:
                by_target.setdefault(dependency_of(s, facts.servers, self.shapes), []).append(s)
            for (dependency, operation), calls in by_target.items():
                if len(calls) >= self.config.min_calls:
                    self._group(trace, dependency, operation, calls, facts.by_id, paths, part)


class RefContention(ContentionDetector):
    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        requests = requests_of(trace)
        if not requests:
            return
        parts = self._windows.at(trace.root.start_ns)
        if parts is None:
            return
        ops = parts.setdefault(trace.part, {})
        for req in requests:
            held = ops.get((req.service, req.operation))
            if held is None:
                held = ops[(req.service, req.operation)] = _Requests(req.version)
            if len(held.spans) >= self.config.max_requests:
                self.telemetry.drop("max_requests")
                continue
            held.spans.append((req.start_ns, req.end_ns, req.trace_id))


# ---- random traces ------------------------------------------------------------------------------------------------

_SERVICES = [Resource(f"svc{i}", f"1.{i % 2}", "test", "rev") for i in range(4)]
_STATEMENTS = ["SELECT * FROM t WHERE id = 1", "SELECT * FROM t WHERE id = 2", "UPDATE u SET a = 1", ""]


def _span(rng: random.Random, tid: str, sid: str, parent: str, at: int) -> Span:
    kind = rng.choice((SpanKind.SERVER, SpanKind.CLIENT, SpanKind.CLIENT, SpanKind.CLIENT, SpanKind.INTERNAL))
    start = at + rng.randrange(0, 400) * MS
    long = rng.random() < 0.03
    end = start + (rng.randrange(2_000, 40_000) if long else rng.randrange(0, 60)) * MS
    error = rng.random() < 0.25
    exception = rng.choice(("", "TimeoutError", "ValueError", "DeadlineExceeded")) if error else ""
    db = None
    if kind == SpanKind.CLIENT and rng.random() < 0.35:
        db = DbCall(
            rng.choice(("postgresql", "mysql", "")),
            rng.choice(_STATEMENTS),
            rng.choice(("", "shop")),
            params=rng.choice(((), (1,), (2,))),
        )
    # (skewed: some hops and operations are hot, so that the bounds per window and per hop are reached)
    [name] = rng.choices(("GET", "POST", "query", "work"), (6, 2, 1, 1))
    [service] = rng.choices(_SERVICES, (7, 1, 1, 1))
    [route] = rng.choices(("", "/a", "/b", "/c/{id}"), (1, 6, 2, 1))
    return Span(
        tid,
        sid,
        parent,
        name,
        kind,
        start,
        end,
        StatusCode.ERROR if error else StatusCode.UNSET,
        service,
        route=route,
        http_status=rng.choice((0, 200, 429, 500, 503, 408, 504)),
        exception_type=exception,
        exception_message=rng.choice(("", "timed out", "boom")) if error else "",
        db=db,
    )


def _trace(rng: random.Random, n: int, at: int) -> ClosedTrace:
    tid = f"{n:032x}"
    ids: list[str] = []
    spans = []
    for i in range(rng.randrange(1, 14)):
        r = rng.random()
        sid = "" if r < 0.02 else rng.choice(ids) if r < 0.05 and ids else f"{n:08x}{i:08x}"
        r = rng.random()
        if i == 0 or r < 0.05:
            parent = ""
        elif r < 0.08:
            parent = f"{n:08x}{i + 1:08x}"  # a later span (parent cycles) or one never seen
        elif r < 0.1:
            parent = "feedfacefeedface"
        else:
            parent = rng.choice(ids[-4:]) if r < 0.9 else ids[0]
        ids.append(sid)
        spans.append(_span(rng, tid, sid, parent, at))
    rng.shuffle(spans) if rng.random() < 0.2 else None
    return ClosedTrace(tid, tuple(spans), part=rng.choice(("spans/0", "spans/1")))


def _state(d: Processor) -> str:
    """Everything a detector keeps and counts."""
    windows: Any = getattr(d, "_windows", None) or d.windows._windows  # type: ignore[attr-defined]
    held: list[str] = []
    windows.each(lambda value: held.append(repr(value)))
    parts = [held, sorted(d.telemetry.events.items()), sorted(d.telemetry.dropped.items())]  # type: ignore[attr-defined]
    for name in ("_learned", "_recent"):
        lru = getattr(d, name, None)
        if lru is not None:
            parts.append(list(lru.items()))
    for name in ("_thresholds", "_closed"):
        parts.append(getattr(d, name, None))
    rng = getattr(d, "_rng", None)
    parts.append(rng.getstate() if rng is not None else None)
    shapes = getattr(d, "shapes", None)
    parts.append(list(shapes._known.items()) if shapes is not None else None)
    return repr(parts)


Make = Callable[[type[Any]], Processor]

CASES: dict[str, tuple[Make, type[Any], type[Any]]] = {
    "hangs": (
        lambda cls: cls(
            HangConfig(
                factor=2, min_hang_s=0.5, min_baseline=10, baseline_size=64, per_window=8, min_calls=1, max_hops=500
            ),
            WINDOWS,
            telemetry=Telemetry("hangs"),
        ),
        RefHangs,
        HangDetector,
    ),
    "hangs_bounded": (
        lambda cls: cls(
            HangConfig(factor=2, min_hang_s=0.5, min_baseline=10, baseline_size=32, per_window=8, max_hops=6),
            WINDOWS,
            telemetry=Telemetry("hangs"),
        ),
        RefHangs,
        HangDetector,
    ),
    "fanout": (
        lambda cls: cls(
            FanoutConfig(
                min_calls=2,
                max_concurrency_ratio=0.9,
                min_saving_ms=0,
                min_saving_share=0,
                max_operations=12,
                max_fingerprints=6,
                shape_cache=2,
            ),
            2 * S,
            1 * S,
            max_windows=5,
            telemetry=Telemetry("fanout"),
        ),
        RefFanout,
        FanoutDetector,
    ),
    "contention": (
        lambda cls: cls(
            ContentionConfig(
                max_requests=100, min_pairs=20, min_windows=1, alpha=0.5, min_rho=0.01, min_ratio=1.01, max_operations=5
            ),
            WIDE,
            telemetry=Telemetry("contention"),
        ),
        RefContention,
        ContentionDetector,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_detector_keeps_and_emits_what_the_previous_logic_did(name: str, seed: int) -> None:
    make, reference_cls, detector_cls = CASES[name]
    reference, detector = make(reference_cls), make(detector_cls)
    rng = random.Random(seed)
    emitted = 0
    for n in range(1_000):
        at = T0 + n * 40 * MS - rng.choice((0, 0, 0, 1, 2, 5)) * S  # some traces start in a window closed already: late
        trace = _trace(rng, n, at)
        for d in (reference, detector):
            d.on_trace(ClosedTrace(trace.trace_id, trace.spans, part=trace.part), ())  # each its own facts
        if n % 25 == 24:
            outs = []
            for d in (reference, detector):
                out = Emit()
                d.on_watermark(at - S, None, out)
                outs.append(repr(out.events) + repr(out.quarantined))
            assert outs[0] == outs[1]
            emitted += outs[0].count("FindingEvent(")
        if n % 25 == 24:
            assert _state(reference) == _state(detector), (name, seed, n)
    assert _state(reference) == _state(detector)
    if name == "hangs":  # (hot hops: past per_window calls, a uniform sample of their durations)
        assert reference._rng.getstate() != random.Random(0).getstate()  # type: ignore[attr-defined]
    elif name == "hangs_bounded":  # (its hops' distributions go before they judge a call)
        assert detector.telemetry.dropped["max_hops"] and detector.telemetry.dropped["learned_callees"]  # type: ignore[attr-defined]
    elif name == "contention":  # (random latencies make no contention: its findings are not on_trace's part)
        assert sum(len(r.pairs) for r in reference._recent.values()) > 0  # type: ignore[attr-defined]
        assert detector.telemetry.dropped["max_requests"]  # type: ignore[attr-defined]
    else:
        assert emitted > 0  # the corpus makes findings: the comparison covered their paths
    dropped = {reason: n for reason, n in detector.telemetry.dropped.items() if n}  # type: ignore[attr-defined]
    assert dropped  # ... and hits bounds (late windows at least)


# ---- the shared helpers, read from the detail slot ---------------------------------------------------------------


class _Detail:
    def span_detail(self, source: Span) -> SpanDetail:
        return source.detail


def _lazy(span: Span) -> Span:
    """``span`` as a decoder makes it: its detail read on first use."""
    return lazy_span(span.trace_id, span.span_id, span.parent_id, span.name, span.kind, span.start_ns, span.end_ns,
                     span.status, span.resource, _Detail(), span)  # fmt: skip


def _call(sid: str, parent: str, service: Resource, *, name: str = "GET", kind: SpanKind = SpanKind.CLIENT,
          route: str = "", error: bool = False, http: int = 0, db: DbCall | None = None) -> Span:  # fmt: skip
    status = StatusCode.ERROR if error else StatusCode.UNSET
    return Span("t" * 32, sid, parent, name, kind, T0, T0 + MS, status, service, route=route, http_status=http, db=db)


_SHOP, _PAY = _SERVICES[0], _SERVICES[1]
# (span, the server span answering it or None) -> dependency_of
_DEPENDENCIES = [
    (_call("c1", "r", _SHOP, name="query", db=DbCall("postgresql", "SELECT * FROM t WHERE id = 1", "shop")), None,
     ("postgresql/shop", "select * from t where id = ?")),
    (_call("c2", "r", _SHOP, name="query", db=DbCall("mysql", "UPDATE u SET a = 1", "")), None,
     ("mysql", "update u set a = ?")),
    (_call("c3", "r", _SHOP, name="query", db=DbCall("", "", "")), None, ("db", "query")),
    (_call("c4", "r", _SHOP), _call("s4", "c4", _PAY, name="POST", kind=SpanKind.SERVER, route="/pay/{id}"),
     ("svc1", "/pay/{id}")),
    (_call("c5", "r", _SHOP), _call("s5", "c5", _PAY, name="POST", kind=SpanKind.SERVER), ("svc1", "POST")),
    (_call("c6", "r", _SHOP, name="GET"), None, ("GET", "GET")),
]  # fmt: skip
# span -> failed
_FAILED = [
    (_call("f1", "r", _SHOP, error=True, http=200), True),
    (_call("f2", "r", _SHOP, http=500), True),
    (_call("f3", "r", _SHOP, http=503), True),
    (_call("f4", "r", _SHOP, http=429), True),
    (_call("f5", "r", _SHOP, http=499), False),
    (_call("f6", "r", _SHOP, http=404), False),
    (_call("f7", "r", _SHOP), False),
]
# A request in svc0 (server "/a" under a root "job" span) calling svc1 (server without a route), with a parent
# cycle in svc0 and a span whose parent is unknown: (span id, the hang detector's operation of it)
_TREE = [
    _call("root", "", _SHOP, name="job", kind=SpanKind.INTERNAL, route="/job"),
    _call("srv", "root", _SHOP, name="GET", kind=SpanKind.SERVER, route="/a"),
    _call("work", "srv", _SHOP, name="work", kind=SpanKind.INTERNAL),
    _call("db", "work", _SHOP, name="query"),
    _call("out", "work", _SHOP, name="POST"),
    _call("in", "out", _PAY, name="POST", kind=SpanKind.SERVER),
    _call("deep", "in", _PAY, name="query"),
    _call("orphan", "gone", _SHOP, name="lost", route="/x"),
    _call("loop1", "loop2", _SHOP, name="l1", kind=SpanKind.INTERNAL),
    _call("loop2", "loop1", _SHOP, name="l2", kind=SpanKind.INTERNAL),
]
_HOP_OPERATIONS = {"root": "/job", "srv": "/job", "work": "/a", "db": "/a", "out": "/a", "in": "POST",
                   "deep": "POST", "orphan": "/x", "loop1": "l1", "loop2": "l2"}  # fmt: skip


@pytest.mark.parametrize("lazy", [False, True])
def test_the_shared_helpers_answer_from_the_detail(lazy: bool) -> None:
    """``failed``, ``dependency_of``, ``operation_of`` and the hang detector's operations, on hand-built spans: on
    spans whose detail is read and on lazy ones (each helper the first to read it)."""
    fresh: Callable[[Span], Span] = _lazy if lazy else (lambda s: s)
    shapes = Shapes(16, Telemetry("shapes"))
    for call, server, expected in _DEPENDENCIES:
        servers = {} if server is None else {call.span_id: fresh(server)}
        assert dependency_of(fresh(call), servers, shapes) == expected, call
    for call, expected_failed in _FAILED:
        assert failed(fresh(call)) is expected_failed, call
    assert [operation_of(fresh(s)) for s in _TREE] == [s.route or s.name for s in _TREE]
    spans = [fresh(s) for s in _TREE]
    by_id = {s.span_id: s for s in spans}
    assert {s.span_id: hop_operation(s, by_id) for s in spans} == _HOP_OPERATIONS
    if lazy:
        assert any(isinstance(s, LazySpan) for s in spans[1:])  # (some read no detail: the helpers ask the slot)
