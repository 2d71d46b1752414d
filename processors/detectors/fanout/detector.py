"""Serialized fan-out: N calls to one dependency in one request that run k at a time, read from each closed trace.

In one trace, the CLIENT spans under one parent span are grouped by what they call (``dependency_of``: the callee
service and the route it served, the database and the statement's shape, else the span's name). A group is a
serialized fan-out when it holds at least ``min_calls`` calls that ran at most ``max_concurrency_ratio`` of them at
a time (``k`` = the most open at one instant), and when running them all at once would save at least
``min_saving_ms`` and ``min_saving_share`` of the request on its critical path: the saving is the wall time the
calls took together less the longest call, and no more than what the calls hold of the request's critical path
(``processors.pipeline.critical_path.on_path``) less the longest call. Database statements run one at a time
(k = 1) are the N+1 detector's (one query per item); a pool running them k > 1 at a time is this detector's.

Occurrences are tallied per fingerprint (service, route, dependency, operation: stable across deploys) and
event-time window, and one ``FindingEvent`` per fingerprint is emitted when the window closes, with the calls per
affected request, the concurrency over time of the worst one, and the remedy ``parallelize_calls``.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from processors.detectors.fanout.config import FanoutConfig
from processors.detectors.fanout.data import PARALLELIZE, TYPE, FanoutData
from processors.findings.tally_detector import TallyDetector, tally_finding
from processors.findings.trace_windows import (
    PartWindow,
    Tally,
    WindowFindings,
    dependency_of,
    held_ns,
    max_overlap,
    operation_of,
    request_above,
    union_ns,
)
from processors.model.events import Access
from processors.model.finding import FindingEvent, Point, Series, Severity
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS
from processors.pipeline.critical_path import on_path


def concurrency(calls: Sequence[Span]) -> list[tuple[float, float]]:
    """The calls open over time: (ms since the first call started, calls open from then on), one point per edge."""
    origin = min(c.start_ns for c in calls)
    edges = sorted(e for c in calls for e in ((c.start_ns, 1), (c.end_ns, -1)))
    points: list[tuple[float, float]] = []
    depth = 0
    for at, step in edges:
        depth += step
        x = (at - origin) / MS_NS
        if points and points[-1][0] == x:
            points[-1] = (x, depth)
        else:
            points.append((x, depth))
    return points[:500]


_parent_id = attrgetter("parent_id")
COMPONENT = "fanout"  # the component (its config section and telemetry); its findings' type is TYPE


class FanoutDetector(TallyDetector):
    """Calls to one dependency run k at a time, per request; see the module docstring."""

    name = COMPONENT
    finding_type = TYPE

    def __init__(self, config: FanoutConfig, window_ns: int, grace_ns: int, **kwargs: Any) -> None:
        super().__init__(config, window_ns, grace_ns, **kwargs)
        self.config = config

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        part = self.windows.window(trace)
        if part is None:
            return
        facts = trace.facts
        clients = facts.clients
        min_calls = self.config.min_calls
        n = len(clients)
        if n < min_calls or n - len(set(map(_parent_id, clients))) + 1 < min_calls:
            return  # no parent span can have min_calls calls under it (the others have one each at least)
        by_parent: dict[str, list[Span]] = {}
        for s in clients:
            by_parent.setdefault(s.parent_id, []).append(s)
        wide = [group for group in by_parent.values() if len(group) >= self.config.min_calls]
        if not wide:
            return
        servers = facts.servers  # servers_below
        by_id = facts.by_id
        paths: dict[str, dict[str, int]] = {}
        for group in wide:
            by_target: dict[tuple[str, str], list[Span]] = {}
            for s in group:
                by_target.setdefault(dependency_of(s, servers, self.shapes), []).append(s)
            for (dependency, operation), calls in by_target.items():
                if len(calls) >= self.config.min_calls:
                    self._group(trace, dependency, operation, calls, by_id, paths, part)

    def _group(self, trace: ClosedTrace, dependency: str, operation: str, calls: list[Span],
               by_id: dict[str, Span], paths: dict[str, dict[str, int]], part: PartWindow) -> None:  # fmt: skip
        """Tally one group of calls to one target under one parent when it is a serialized fan-out."""
        n = len(calls)
        intervals = [(c.start_ns, c.end_ns) for c in calls]
        k = max_overlap(intervals)
        if k > self.config.max_concurrency_ratio * n:
            return
        if k == 1 and all(c.db is not None for c in calls):
            return  # one statement at a time: the N+1 detector's loop
        first = calls[0]
        request = request_above(first, by_id) or trace.root
        path = paths.get(request.span_id)
        if path is None:
            path = paths[request.span_id] = on_path(trace.spans, request, trace.facts.by_end)
        serial = union_ns(intervals)
        ideal = max(c.end_ns - c.start_ns for c in calls)
        held = held_ns(calls, path, trace.spans)
        saving = max(0, min(serial - ideal, held - ideal))
        duration = max(1, request.end_ns - request.start_ns)
        share = min(1.0, saving / duration)
        if saving < self.config.min_saving_ms * MS_NS or share < self.config.min_saving_share:
            return
        service, route, version = request.resource.service, operation_of(request), request.resource.version
        key = (service, route, dependency, operation)
        tally = self.windows.tally(part, key, lambda: Tally(service, route, dependency, version))
        if tally is None:
            return
        tally.add(trace.trace_id, request.start_ns, n, max_points=self.config.max_points, occurrences=n)
        tally.total("serial_ms", serial / MS_NS)
        tally.total("ideal_ms", ideal / MS_NS)
        tally.total("saving_ms", saving / MS_NS)
        tally.total("share", share)
        tally.peak("calls", n)
        if tally.peak("saving_ms", saving / MS_NS):
            parent = by_id.get(first.parent_id)
            tally.facts = {
                "operation": operation,
                "parent": (parent.code_function or parent.name) if parent is not None else "",
                "trace": trace.trace_id,
                "calls": str(n),
                "concurrency": str(k),
            }
            tally.profile = concurrency(calls)
        self.telemetry.count("fanouts")

    def finding(self, window: WindowFindings, fingerprint: str, tally: Tally) -> FindingEvent:
        facts, sums, r = tally.facts, tally.sums, tally.requests
        seen = window.requests.get((tally.service, tally.operation), 0)
        data = FanoutData(
            service=tally.service, route=tally.operation, dependency=tally.entity, operation=facts["operation"],
            parent_operation=facts["parent"], window=window.window_id, requests=r, requests_seen=seen,
            max_calls=int(facts["calls"]), max_concurrency=int(facts["concurrency"]),
            calls_mean=round(tally.occurrences / r, 2), serial_ms_mean=round(sums["serial_ms"] / r, 3),
            ideal_ms_mean=round(sums["ideal_ms"] / r, 3), saving_ms_mean=round(sums["saving_ms"] / r, 3),
            saving_ms_max=round(tally.peaks["saving_ms"], 3), saving_share_mean=round(min(1.0, sums["share"] / r), 4),
            example_trace=facts["trace"],
        )  # fmt: skip
        of_seen = f" of {seen}" if seen else ""
        under = f" under {data.parent_operation}" if data.parent_operation else ""
        evidence = [
            f"{r}{of_seen} requests of {tally.operation} ({tally.service}) called {data.dependency} "
            f"{data.operation} {data.calls_mean:g} times on average{under}; the worst made {data.max_calls} calls "
            f"running at most {data.max_concurrency} at a time",
            f"the calls took {data.serial_ms_mean:.1f} ms together per request; all at once they would take "
            f"{data.ideal_ms_mean:.1f} ms (the longest call)",
            f"full concurrency would save {data.saving_ms_mean:.1f} ms of the critical path per request "
            f"({data.saving_share_mean:.0%} of the request), {data.saving_ms_max:.1f} ms at most",
            f"remedy {PARALLELIZE}: issue the independent calls concurrently (or one batched call)",
            f"example trace {data.example_trace}",
        ]
        severity: Severity = "high" if data.saving_share_mean >= 0.5 else "medium"
        return tally_finding(
            window, fingerprint, tally, finding_type=TYPE,
            title=f"Serialized fan-out in {tally.operation}: {data.max_calls} calls to {data.dependency} "
                  f"{data.max_concurrency} at a time",
            severity=severity, remedy=PARALLELIZE, evidence=evidence, data=data.model_dump(),
            series=[
                Series(name="calls per affected request", x_label="request start (Unix ms)", y_label="calls",
                       points=[Point(x=x, y=y) for x, y in tally.points]),
                Series(name="calls in flight in the worst request", x_label="ms since its first call",
                       y_label="concurrent calls", points=[Point(x=x, y=y) for x, y in tally.profile]),
            ],
        )  # fmt: skip
