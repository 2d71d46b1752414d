"""The slowest requests' critical paths, walked when a window closes, sum as the walk on arrival did.

``SlowTraces`` keeps a request with its trace and walks its critical path only when the window's ownership is
read. The reference below is the previous behaviour, kept here: every request that entered the sample was walked on
arrival and kept with its ownership. On random traces (several services and versions, parallel and clipped children,
database calls, duplicate span ids, a parent cycle, traces delivered twice, two input partitions, small samples that
replace most of what enters them) both give the same windows: ownership (with its owners' order), rows and relays.
"""

from __future__ import annotations

import random

import pytest

import processors.detectors.regressions.stats as stats_module
from processors.detectors.regressions.shares import shares
from processors.detectors.regressions.stats import (
    OpStats,
    Owned,
    ServiceStats,
    SlowTraces,
    StatsWindow,
    request_path,
    stats_rows,
)
from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.critical_path import critical_path
from processors.pipeline.requests import Request
from tests.regressions.builders import MS, T0, S

SIZE = 10 * S
GRACE = 2 * S


class EagerSlowTraces(SlowTraces):
    """The reference: a request's critical path walked as it enters the sample (what ``ServiceStats.add`` did)."""

    walks = 0

    def add(self, duration_ns: int, span_id: str, owned: Owned | ClosedTrace) -> None:
        if isinstance(owned, ClosedTrace):  # (``ServiceStats.add`` before, as it was)
            EagerSlowTraces.walks += 1
            trace, facts = owned, owned.facts
            start = facts.by_id[span_id] if facts.unique else next(s for s in trace.spans if s.span_id == span_id)
            owned = critical_path(trace.spans, start, facts.by_end, unique=facts.unique)
        super().add(duration_ns, span_id, owned)


class EagerStats(ServiceStats):
    __slots__ = ()

    def _new(self, req: Request) -> OpStats:
        op = super()._new(req)
        op.slow = EagerSlowTraces(self.slow_traces)
        return op


def _trace(rng: random.Random, n: int) -> ClosedTrace:
    """A random trace: a root request, server spans of other services, internal and database children."""
    trace_id = f"{n:032x}"
    at = T0 + rng.randrange(3 * SIZE)
    services = ["front", "cart", "pay"]
    size = rng.randint(1, 12)
    duplicate = rng.random() < 0.1
    spans: list[Span] = []
    for i in range(1, size + 1):
        sid = f"{n:08x}{(1 if duplicate and i == 2 else i):08x}"
        parent = "" if i == 1 else spans[rng.randrange(i - 1)].span_id
        if i == 1 and size > 2 and rng.random() < 0.05:
            parent = f"{n:08x}{size:08x}"  # a parent cycle through the last span
        start = at + rng.randint(-5, 80) * MS if i > 1 else at
        end = start + rng.randint(0, 120) * MS
        service = rng.choice(services)
        server = i == 1 or rng.random() < 0.35
        db = not server and rng.random() < 0.3
        kind = SpanKind.SERVER if server else SpanKind.CLIENT if db else SpanKind.INTERNAL
        route = rng.choice(["/a", "/b", "/c"]) if server else ""
        status = StatusCode.ERROR if rng.random() < 0.05 else StatusCode.UNSET
        spans.append(Span(trace_id, sid, parent, f"GET {route}" if server else f"op{i}", kind, start, end, status,
                          Resource(service, rng.choice(["1.0", "1.1"]), "test", "rev"), route=route,
                          db=DbCall(rng.choice(["postgresql", ""]), "SELECT 1") if db else None))  # fmt: skip
    return ClosedTrace(trace_id, tuple(spans), part=rng.choice(["p/0", "p/1"]))


def _run(stats: ServiceStats, traces: list[ClosedTrace]) -> list[StatsWindow]:
    out: list[StatsWindow] = []
    for i, trace in enumerate(traces):
        stats.add(trace)
        if i % 97 == 96:
            out.extend(stats.close_until(trace.start_ns - SIZE))
    return [*out, *stats.close_until(T0 + 10 * SIZE)]


def test_walking_when_read_sums_as_walking_on_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(6):
        rng = random.Random(seed)
        traces = [_trace(rng, n) for n in range(1, 900)]
        again = [ClosedTrace(t.trace_id, t.spans, part=t.part) for t in rng.sample(traces, 60)]  # delivered twice
        traces = sorted([*traces, *again], key=lambda t: t.start_ns)
        slow = rng.choice([1, 3, 8])
        EagerSlowTraces.walks = 0
        walked = 0

        def walk(trace: ClosedTrace, span_id: str) -> Owned:
            nonlocal walked
            walked += 1
            return request_path(trace, span_id)

        deferred = ServiceStats(SIZE, GRACE, slow_traces=slow, reservoir_size=16, seed=seed)
        reference = EagerStats(SIZE, GRACE, slow_traces=slow, reservoir_size=16, seed=seed)
        with monkeypatch.context() as patched:
            patched.setattr(stats_module, "request_path", walk)
            got = _run(deferred, traces)
        want = _run(reference, traces)
        assert [w.window_id for w in got] == [w.window_id for w in want] and len(got) >= 3
        for g, w in zip(got, want, strict=True):
            assert list(g.ops) == list(w.ops)
            for key, op in g.ops.items():
                ref = w.ops[key]
                assert list(op.path_ns.items()) == list(ref.path_ns.items())
                assert op.path_traces == ref.path_traces and op.path_traces >= 1
                assert sorted((d, s) for d, s, _ in op.slow.heap) == sorted((d, s) for d, s, _ in ref.slow.heap)
            assert stats_rows(g) == stats_rows(w)
            assert [(r.at_ns, r.body) for r in shares(g)] == [(r.at_ns, r.body) for r in shares(w)]
        assert deferred.telemetry.events == reference.telemetry.events
        assert deferred.telemetry.dropped == reference.telemetry.dropped
        assert 0 < walked < EagerSlowTraces.walks  # fewer walks: those replaced, or under p95, never run
