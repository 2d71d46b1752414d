"""N+1 queries: one statement shape run once per item in a loop, read from each closed trace.

In one trace, the DB client spans under one parent span are grouped by statement shape
(``processors.findings.trace_windows.statement_shape``). A group is a loop when it holds at least ``min_repeats``
statements that ran one after the other (no two overlap: overlapping ones are a pool at work, the fan-out
detector's case), with different parameter values where the spans carry parameters (the same values again are
a repeated lookup, not a loop over items) or, where they carry none as stock instrumentation sends them, that
many identical-shape statements; and when together they took at least ``min_repeated_ms``. What the loop cost is
its statements' share of the request's critical path (``processors.pipeline.critical_path.on_path``).

Occurrences are tallied per fingerprint (service, route, statement shape: the same loop in the next build is the
same finding) and event-time window, and one ``FindingEvent`` per fingerprint is emitted when the window closes,
with the requests it hit among its route's requests (the contract's baseline rate), a chart of the statements per
affected request and the remedy the statement supports: ``batch_query`` for a read, ``bulk_write`` for a write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from processors.detectors.n_plus_one.config import NPlusOneConfig
from processors.detectors.n_plus_one.data import BATCH_QUERY, BULK_WRITE, TYPE, NPlusOneData
from processors.findings.tally_detector import TallyDetector, tally_finding
from processors.findings.trace_windows import (
    PartWindow,
    Tally,
    WindowFindings,
    held_ns,
    max_overlap,
    operation_of,
    request_above,
    statement_verb,
)
from processors.model.events import Access, SpanKind
from processors.model.finding import FindingEvent, Point, Series, Severity
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS
from processors.pipeline.critical_path import on_path


class NPlusOneDetector(TallyDetector):
    """Loops of one statement per item, per request; see the module docstring."""

    name = TYPE
    finding_type = TYPE

    def __init__(self, config: NPlusOneConfig, window_ns: int, grace_ns: int, **kwargs: Any) -> None:
        super().__init__(config, window_ns, grace_ns, **kwargs)
        self.config = config

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        part = self.windows.window(trace)
        if part is None:
            return
        facts = trace.facts
        if len(facts.db) < self.config.min_repeats:
            return
        by_parent: dict[str, list[Span]] = {}
        for s in facts.db:
            db = s.db
            if s.kind == SpanKind.CLIENT and db is not None and db.statement:
                by_parent.setdefault(s.parent_id, []).append(s)
        loops = [group for group in by_parent.values() if len(group) >= self.config.min_repeats]
        if not loops:
            return
        by_id = facts.by_id
        paths: dict[str, dict[str, int]] = {}
        for group in loops:
            by_shape: dict[str, list[Span]] = {}
            for s in group:
                assert s.db is not None
                by_shape.setdefault(self.shapes.of(s.db.statement), []).append(s)
            for shape, statements in by_shape.items():
                if len(statements) >= self.config.min_repeats:
                    self._loop(trace, shape, statements, by_id, paths, part)

    def _loop(self, trace: ClosedTrace, shape: str, statements: list[Span], by_id: dict[str, Span],
              paths: dict[str, dict[str, int]], part: PartWindow) -> None:  # fmt: skip
        """Tally one group of same-shape statements under one parent when it is a loop (module docstring)."""
        if max_overlap((s.start_ns, s.end_ns) for s in statements) > 1:
            return  # run concurrently: not a loop one item at a time
        values = {(s.db.params, s.db.named_params) for s in statements if s.db is not None}
        with_parameters = values != {((), ())}
        if with_parameters and len(values) < self.config.min_repeats:
            return  # the same values again and again: a repeated lookup, not one query per item
        repeated_ns = sum(s.end_ns - s.start_ns for s in statements)
        if repeated_ns < self.config.min_repeated_ms * MS_NS:
            return
        first = statements[0]
        request = request_above(first, by_id) or trace.root
        path = paths.get(request.span_id)
        if path is None:
            path = paths[request.span_id] = on_path(trace.spans, request, trace.facts.by_end)
        share = min(1.0, held_ns(statements, path, trace.spans) / max(1, request.end_ns - request.start_ns))
        service, route = request.resource.service, operation_of(request)
        key = (service, route, shape)
        db = first.db
        assert db is not None
        entity = db.collection or db.system or "db"
        version = request.resource.version
        tally = self.windows.tally(part, key, lambda: Tally(service, route, entity, version))
        if tally is None:
            return
        n = len(statements)
        tally.add(trace.trace_id, request.start_ns, n, max_points=self.config.max_points, occurrences=n)
        tally.total("repeated_ms", repeated_ns / MS_NS)
        tally.total("share", share)
        tally.peak("share", share)
        if tally.peak("count", n):
            parent = by_id.get(first.parent_id)
            tally.facts = {
                "shape": shape,
                "db_system": db.system,
                "parent": (parent.code_function or parent.name) if parent is not None else "",
                "with_parameters": "1" if with_parameters else "",
                "trace": trace.trace_id,
            }
        self.telemetry.count("loops")

    def finding(self, window: WindowFindings, fingerprint: str, tally: Tally) -> FindingEvent:
        facts = tally.facts
        shape = facts["shape"]
        seen = window.requests.get((tally.service, tally.operation), 0)
        mean_count = tally.occurrences / tally.requests
        share_mean = tally.sums["share"] / tally.requests
        share_max = tally.peaks["share"]
        ms_mean = tally.sums["repeated_ms"] / tally.requests
        remedy = BATCH_QUERY if statement_verb(shape) in ("select", "with") else BULK_WRITE
        data = NPlusOneData(
            service=tally.service, route=tally.operation, parent_operation=facts["parent"], statement_shape=shape,
            db_system=facts["db_system"], window=window.window_id, requests=tally.requests, requests_seen=seen,
            statements=tally.occurrences, max_per_request=int(tally.peaks["count"]),
            mean_per_request=round(mean_count, 2), repeated_ms_mean=round(ms_mean, 3),
            critical_path_share_mean=round(share_mean, 4), critical_path_share_max=round(share_max, 4),
            with_parameters=bool(facts["with_parameters"]), example_trace=facts["trace"],
        )  # fmt: skip
        of_seen = f" of {seen}" if seen else ""
        under = f" under {data.parent_operation}" if data.parent_operation else ""
        how = (
            "with a different parameter value each time"
            if data.with_parameters
            else "(no parameters recorded: identical-shape statements one after the other)"
        )
        evidence = [
            f"{tally.requests}{of_seen} requests of {tally.operation} ({tally.service}) ran one statement per item "
            f"in a loop{under}: {data.max_per_request} times at most, {data.mean_per_request:g} on average, {how}",
            f"statement: {shape}",
            f"the repeated statements took {ms_mean:.1f} ms per affected request, {share_mean:.0%} of its critical "
            f"path on average ({share_max:.0%} at most)",
            f"remedy {remedy}: "
            + ("read the rows in one query (an IN list or a JOIN)" if remedy == BATCH_QUERY else "write the rows "
               "in one statement (a multi-row INSERT, an UPDATE/DELETE ... WHERE key IN (...))"),
            f"example trace {facts['trace']}",
        ]  # fmt: skip
        severity: Severity = "high" if share_mean >= 0.5 else "medium" if share_mean >= 0.1 else "low"
        return tally_finding(
            window, fingerprint, tally, finding_type=TYPE,
            title=f"N+1 queries in {tally.operation}: {data.max_per_request} x {shape[:80]}",
            severity=severity, remedy=remedy, evidence=evidence, data=data.model_dump(),
            series=[Series(name="statements per affected request", x_label="request start (Unix ms)",
                           y_label="statements", points=[Point(x=x, y=y) for x, y in tally.points])],
        )  # fmt: skip
