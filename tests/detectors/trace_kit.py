"""Hand-built traces for the per-trace performance detectors: a request, its handler, DB and HTTP client calls."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from processors.api.component import Emit
from processors.model.events import DbCall, Resource, Scalar, SpanKind, StatusCode
from processors.model.finding import FindingEvent
from processors.model.span import Span
from processors.model.trace import ClosedTrace

MS = 1_000_000
S = 1_000 * MS
T0 = 1_800_000_000 * S  # a multiple of every window size used here
WINDOW_NS = 60 * S
GAP_NS = 10 * S
_ids = itertools.count(1)


def _id(width: int) -> str:
    return f"{next(_ids):0{width}x}"


@dataclass
class Request:
    """One request being built: a SERVER span ``<method> <route>`` and its handler span; calls go under the
    handler at the times given (ms after the request's start)."""

    route: str
    start_ns: int
    service: str = "shop"
    version: str = "1.0.0"
    method: str = "GET"
    trace_id: str = field(default_factory=lambda: _id(32))
    spans: list[Span] = field(default_factory=list)
    end_ms: float = 0.0

    def __post_init__(self) -> None:
        self.server_id, self.handler_id = _id(16), _id(16)

    @property
    def resource(self) -> Resource:
        return Resource(self.service, self.version, "test")

    def _at(self, ms: float) -> int:
        self.end_ms = max(self.end_ms, ms)
        return self.start_ns + int(ms * MS)

    def db(self, statement: str, at_ms: float, dur_ms: float, params: tuple[Scalar, ...] = (), *,
           error: bool = False, parent: str = "", system: str = "postgresql") -> Span:  # fmt: skip
        """A DB client span (``db.query.text``, ``db.statement.parameters``)."""
        span = Span(self.trace_id, _id(16), parent or self.handler_id, statement.split(" ", 1)[0],
                    SpanKind.CLIENT, self._at(at_ms), self._at(at_ms + dur_ms),
                    StatusCode.ERROR if error else StatusCode.UNSET, self.resource,
                    db=DbCall(system, statement, params=params))  # fmt: skip
        self.spans.append(span)
        return span

    def call(self, callee: str, route: str, at_ms: float, dur_ms: float, *, status: int = 200, error: bool = False,
             answered: bool = True, name: str = "GET") -> Span:  # fmt: skip
        """An HTTP client span and, when ``answered``, the callee's SERVER span under it."""
        failing = error or status >= 500
        client = Span(self.trace_id, _id(16), self.handler_id, name, SpanKind.CLIENT, self._at(at_ms),
                      self._at(at_ms + dur_ms), StatusCode.ERROR if failing else StatusCode.UNSET, self.resource,
                      http_status=status)  # fmt: skip
        self.spans.append(client)
        if answered:
            self.spans.append(
                Span(
                    self.trace_id,
                    _id(16),
                    client.span_id,
                    f"{name} {route}",
                    SpanKind.SERVER,
                    client.start_ns + MS // 10,
                    client.end_ns - MS // 10,
                    StatusCode.ERROR if failing else StatusCode.UNSET,
                    Resource(callee, "2.0.0", "test"),
                    route=route,
                    http_status=status,
                )
            )
        return client

    def trace(self, *, end_ms: float | None = None, part: str = "otlp_spans/0") -> ClosedTrace:
        end = self._at(end_ms if end_ms is not None else self.end_ms + 1)
        server = Span(self.trace_id, self.server_id, "", f"{self.method} {self.route}", SpanKind.SERVER,
                      self.start_ns, end, StatusCode.UNSET, self.resource, route=self.route,
                      http_status=200)  # fmt: skip
        handler = Span(self.trace_id, self.handler_id, self.server_id, "handler", SpanKind.INTERNAL,
                       self.start_ns + MS // 100, end - MS // 100, StatusCode.UNSET, self.resource,
                       code_function="shop.views.handler")  # fmt: skip
        return ClosedTrace(self.trace_id, (server, handler, *self.spans), part=part)


def close_all(detector: object) -> list[FindingEvent]:
    """Every finding the detector emits once event time is far past everything it saw."""
    out = Emit()
    detector.on_watermark(T0 + 100 * WINDOW_NS, None, out)  # type: ignore[attr-defined]
    assert not out.quarantined, out.quarantined
    return [e for e in out.events if isinstance(e, FindingEvent)]
