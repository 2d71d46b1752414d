"""Hand-built requests, traces, log records and incidents for the regression and proof tests."""

from __future__ import annotations

import itertools
from typing import Any

from processors.model.events import DbCall, LogRecord, Resource, SpanKind, StatusCode
from processors.model.outputs import AccessInfo, IncidentEvent
from processors.model.span import Span
from processors.model.trace import ClosedTrace

MS = 1_000_000
S = 1_000 * MS
T0 = 1_800_000_000 * S  # an event time in 2027, a multiple of every window size used here
TP = ("otlp_spans", 0)
SERVICE = "split"
_ids = itertools.count(1)


def resource(version: str, service: str = SERVICE) -> Resource:
    return Resource(service, version, "test", f"rev-{version}")


def request(
    at_ns: int,
    version: str,
    *,
    route: str = "/split/even",
    function: str = "",
    exception: str = "",
    status: int = 200,
    dur_ms: float = 10.0,
    db_ms: float = 0.0,
    service: str = SERVICE,
) -> ClosedTrace:
    """One HTTP request: a SERVER span ``POST <route>`` and its handler span (and a DB client span if ``db_ms``).

    A 5xx ``status`` (or an ``exception``, which implies 500) fails it: status ERROR, exception on both spans.
    """
    n = next(_ids)
    trace_id = f"{n:032x}"
    res = resource(version, service)
    failed = bool(exception) or status >= 500
    http_status = 500 if exception and status < 500 else status
    fn = function or f"split.handlers.{route.rsplit('/', 1)[-1]}"
    end = at_ns + int(dur_ms * MS)
    status_code = StatusCode.ERROR if failed else StatusCode.UNSET
    server = Span(trace_id, f"{n:012x}0001", "", f"POST {route}", SpanKind.SERVER, at_ns, end, status_code, res,
                  route=route, http_status=http_status, exception_type=exception)  # fmt: skip
    handler = Span(trace_id, f"{n:012x}0002", server.span_id, fn.rsplit(".", 1)[-1], SpanKind.INTERNAL,
                   at_ns + MS // 10, end - MS // 10, status_code, res, exception_type=exception,
                   code_function=fn)  # fmt: skip
    spans = [server, handler]
    if db_ms:
        db_end = end - MS // 5
        db = Span(trace_id, f"{n:012x}0003", handler.span_id, "SELECT", SpanKind.CLIENT, db_end - int(db_ms * MS),
                  db_end, StatusCode.UNSET, res, db=DbCall("postgresql", "SELECT 1"))  # fmt: skip
        spans.append(db)
    return ClosedTrace(trace_id, tuple(spans))


def log(at_ns: int, version: str, event: str, *, service: str = SERVICE) -> LogRecord:
    """An OTel log record with ``event.name``, from the given build."""
    return LogRecord(at_ns, resource(version, service), 9, "INFO", event, event_name=event)


def access(version: str, function: str, route: str, *, at_ms: float, error: bool = False,
           exception: str = "", service: str = SERVICE) -> AccessInfo:  # fmt: skip
    n = next(_ids)
    return AccessInfo(trace_id=f"{n:032x}", span_id=f"{n:016x}", service=service, version=version,
                      function=function, file="app.py", route=route, operation="write", lock="none",
                      statement="UPDATE orders SET status = %s WHERE id = %s", params=[], set_values={},
                      start_unix_ms=at_ms, offset_ms=0.0, error=error, exception=exception,
                      http_status=500 if error else 200)  # fmt: skip


def incident(culprit: AccessInfo, victim: AccessInfo, *, fingerprint: str = "fp-lost-update",
             **overrides: Any) -> IncidentEvent:  # fmt: skip
    """A manifest lost update on ``orders:<n>`` between the two accesses."""
    n = next(_ids)
    fields: dict[str, Any] = dict(fingerprint=fingerprint, occurrence=f"occ-{n}", anomaly="lost_update",
                                  severity="high", manifest=True, entity=f"orders:{n}", table="orders",
                                  window_ms=5.0, summary="lost update", damage="status overwritten",
                                  confidence=0.9, culprit=culprit, victim=victim, writers=[culprit, victim],
                                  accesses=[culprit, victim], commits=[], evidence=[],
                                  detected_at_unix_ms=culprit.start_unix_ms)  # fmt: skip
    fields.update(overrides)
    return IncidentEvent(**fields)


def statement_params(statement: str) -> set[str]:
    """The ``r.<name>`` parameters an ``UNWIND $rows AS r`` statement reads."""
    import re

    return set(re.findall(r"\br\.(\w+)", statement))
