"""Retry storms: one call tried again after errors, within a request or across a burst of requests.

In one trace, the CLIENT spans under one parent span are grouped by what they call (``dependency_of``: the callee
service and the route it served, the database and the statement's shape, else the span's name) and cut into
*logical calls*: an attempt that starts after the previous attempt of the group failed (status ERROR, HTTP 5xx or
429) and ended is a retry of it; any other attempt starts a new logical call. Every request's calls are counted,
so that the window knows each dependency's attempts per logical call (the *amplification*), retried or not.

Per fingerprint (service, route, dependency, operation: stable across deploys) and event-time window, a finding is
emitted when the window closes if some request made ``min_attempts`` attempts of one call, each after a failure
(a storm within a trace), or if ``min_burst_traces`` requests retried it and the dependency saw
``min_amplification`` attempts per logical call of which ``min_failed_share`` failed (a burst across traces against
a failing dependency; retries that win after one conflict, as serialization retries under contention do, are not).
Its remedy is what the gaps support: retries that came sooner than ``backoff_floor_ms`` after the failure on average
need ``backoff_with_jitter``; retries that already wait and still multiply the load need a ``retry_budget``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from processors.detectors.retry_storm.config import RetryStormConfig
from processors.detectors.retry_storm.data import BACKOFF, BUDGET, TYPE, RetryStormData
from processors.findings.tally_detector import TallyDetector, tally_finding
from processors.findings.trace_windows import (
    PartWindow,
    Tally,
    WindowFindings,
    dependency_of,
    failed,
    operation_of,
    request_above,
)
from processors.model.events import Access
from processors.model.finding import FindingEvent, Point, Series
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS


def chains(attempts: Sequence[Span]) -> list[list[Span]]:
    """Attempts (sorted by start) cut into logical calls: a retry follows a failed attempt that had ended."""
    out: list[list[Span]] = []
    for a in attempts:
        if out and failed(out[-1][-1]) and a.start_ns >= out[-1][-1].end_ns:
            out[-1].append(a)
        else:
            out.append([a])
    return out


class RetryStormDetector(TallyDetector):
    """Calls retried after errors, per request and per window; see the module docstring."""

    name = TYPE
    finding_type = TYPE

    def __init__(self, config: RetryStormConfig, window_ns: int, grace_ns: int, **kwargs: Any) -> None:
        super().__init__(config, window_ns, grace_ns, **kwargs)
        self.config = config

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        part = self.windows.window(trace)
        if part is None:
            return
        facts = trace.facts
        clients = facts.clients
        if not clients:
            return
        servers = facts.servers  # the server span answering each client span, by the client's span id
        by_id = facts.by_id
        groups: dict[tuple[str, str, str], list[Span]] = {}
        for s in clients:
            groups.setdefault((s.parent_id, *dependency_of(s, servers, self.shapes)), []).append(s)
        requests: dict[str, Span] = {}  # by parent span id
        for (parent, dependency, operation), attempts in groups.items():
            request = requests.get(parent)
            if request is None:
                request = requests[parent] = request_above(attempts[0], by_id) or trace.root
            key = (request.resource.service, operation_of(request), dependency, operation)
            if len(attempts) == 1:
                self.windows.count(part, key, 1, 1, failed(attempts[0]))
                continue
            failures = sum(map(failed, attempts))
            if not failures:  # no retry: each attempt a call of its own
                self.windows.count(part, key, len(attempts), len(attempts), 0)
                continue
            attempts.sort(key=lambda s: (s.start_ns, s.end_ns))
            self._retries(trace, request, key, attempts, failures, part)

    def _retries(self, trace: ClosedTrace, request: Span, key: tuple[str, str, str, str], attempts: list[Span],
                 failures: int, part: PartWindow) -> None:  # fmt: skip
        """Count one group's attempts and logical calls; tally its retries."""
        service, route, dependency, operation = key
        version = request.resource.version
        logical = chains(attempts)
        self.windows.count(part, key, len(attempts), len(logical), failures)
        retried = [c for c in logical if len(c) > 1]
        if not retried:
            return
        tally = self.windows.tally(part, key, lambda: Tally(service, route, dependency, version,
                                                            facts={"operation": operation}))  # fmt: skip
        if tally is None:
            return
        longest = max(len(c) for c in retried)
        retries = sum(len(c) - 1 for c in retried)
        tally.add(trace.trace_id, request.start_ns, longest, max_points=self.config.max_points, occurrences=retries)
        tally.total("gap_ms", sum((b.start_ns - a.end_ns) / MS_NS for c in retried for a, b in pairwise(c)))
        tally.total("gaps", retries)
        tally.total("exhausted", sum(1 for c in retried if failed(c[-1])))
        if tally.peak("attempts", longest):
            tally.facts = {"operation": operation, "trace": trace.trace_id}
        self.telemetry.count("retried_calls", len(retried))

    def finding(self, window: WindowFindings, fingerprint: str, tally: Tally) -> FindingEvent | None:
        c, sums = self.config, tally.sums
        calls_attempts, calls_logical, calls_failed = window.counts[fingerprint]
        attempts, logical = int(calls_attempts), int(calls_logical)
        amplification = attempts / logical
        longest = int(tally.peaks["attempts"])
        within = longest >= c.min_attempts
        failed_share = calls_failed / attempts
        burst = (tally.requests >= c.min_burst_traces and amplification >= c.min_amplification
                 and failed_share >= c.min_failed_share)  # fmt: skip
        if not (within or burst):
            return None
        gap = sums["gap_ms"] / sums["gaps"]
        remedy = BACKOFF if gap < c.backoff_floor_ms else BUDGET
        seen = window.requests.get((tally.service, tally.operation), 0)
        data = RetryStormData(
            service=tally.service, route=tally.operation, dependency=tally.entity, operation=tally.facts["operation"],
            window=window.window_id, within_trace=within, burst=burst, requests=tally.requests, requests_seen=seen,
            attempts=attempts, logical_calls=logical, amplification=round(amplification, 3), max_attempts=longest,
            failed_share=round(failed_share, 4),
            exhausted=int(sums["exhausted"]), retry_gap_ms_mean=round(gap, 3), example_trace=tally.facts["trace"],
        )  # fmt: skip
        of_seen = f" of {seen}" if seen else ""
        how = [
            f"{tally.requests}{of_seen} requests of {tally.operation} ({tally.service}) called {data.dependency} "
            f"{data.operation} again after it failed; the worst tried {longest} times",
            f"{data.dependency} saw {attempts} attempts for {logical} logical calls in the window: amplification "
            f"x{amplification:.2f}; {failed_share:.0%} of the attempts failed, and {data.exhausted} retried calls "
            f"failed on their last attempt too",
            f"retries came {gap:.1f} ms after the failure on average"
            + (" (no backoff)" if remedy == BACKOFF else " (backing off, still multiplying the load)"),
            f"remedy {remedy}: "
            + ("wait before retrying, growing and randomised" if remedy == BACKOFF else "cap the retries per "
               "window and client so that a failing dependency sees no more load than it did"),
            f"example trace {data.example_trace}",
        ]  # fmt: skip
        return tally_finding(
            window, fingerprint, tally, finding_type=TYPE,
            title=f"Retry storm on {data.dependency} from {tally.operation}: x{amplification:.1f} attempts, "
                  f"up to {longest} per call",
            severity="high" if burst and amplification >= 2 else "medium", remedy=remedy, evidence=how,
            data=data.model_dump(),
            series=[Series(name="attempts of the retried call per request", x_label="request start (Unix ms)",
                           y_label="attempts", points=[Point(x=x, y=y) for x, y in tally.points])],
        )  # fmt: skip
