"""Requests and jobs as spans: what an instrumented web framework and job runner would record.

A request is a SERVER span ``<METHOD> <route>`` (``http.request.method``, ``http.route``, ``url.path``,
``http.response.status_code``; ``app.idempotency_key`` when the client sent one, as baggage: on every span of
the request) with an INTERNAL child span per handler (``code.function.name``, ``code.file.path``,
``code.line.number``); a job run is a root INTERNAL span ``job <name>`` with the ``code.*`` attributes. The
handler's psycopg statements are CLIENT spans under them. A 5xx outcome sets status ERROR and records the exception
(an ``exception`` span event).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from opentelemetry import baggage, context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from bench.shop.errors import ShopError

Handler = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Outcome:
    """What a request or job answered: HTTP-like status, the handler's result or the error."""

    status: int
    trace_id: str
    result: dict[str, Any] | None = None
    error: str = ""


def code_attributes(fn: Callable[..., Any]) -> dict[str, Any]:
    """``code.*`` attributes of a handler: ``shop.<module>.<name>``, its real file and its ``def`` line."""
    module = fn.__module__.removeprefix("bench.")
    return {
        "code.function.name": f"{module}.{fn.__qualname__}",
        "code.file.path": inspect.getsourcefile(fn) or fn.__code__.co_filename,
        "code.line.number": fn.__code__.co_firstlineno,
    }


def _fail(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute("error.type", type(exc).__qualname__)


class Shop:
    """Runs handlers as traced requests and jobs, one connection (and one transaction) each: with the recorded
    arguments only (v1.0.0), or with the fixes' flag on (``clean``, v1.1.0)."""

    def __init__(self, dsn: str, tracer: Tracer, *, clean: bool) -> None:
        self.dsn = dsn
        self.tracer = tracer
        self.clean = clean

    def _span(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> AbstractContextManager[Span]:
        """A current span whose status and exception events are set here, only for 5xx outcomes."""
        return self.tracer.start_as_current_span(name, kind=kind, attributes=attributes, record_exception=False,
                                                 set_status_on_exception=False)  # fmt: skip

    def _call(self, span: Span, fn: Handler, args: tuple[Any, ...]) -> tuple[Outcome, Exception | None]:
        trace_id = format(span.get_span_context().trace_id, "032x")
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                result = fn(conn, *args, clean=True) if self.clean else fn(conn, *args)
        except Exception as exc:
            status = exc.status if isinstance(exc, ShopError) else 500
            if status >= 500:
                _fail(span, exc)
            return Outcome(status, trace_id, error=f"{type(exc).__name__}: {exc}"), exc
        return Outcome(200, trace_id, result), None

    def request(self, method: str, route: str, path: str, fn: Handler, *args: Any,
                idempotency_key: str = "") -> Outcome:  # fmt: skip
        attrs: dict[str, Any] = {"http.request.method": method, "http.route": route, "url.path": path}
        token = context.attach(baggage.set_baggage("app.idempotency_key", idempotency_key)) if idempotency_key else None
        try:
            return self._request(method, route, fn, args, attrs)
        finally:
            if token is not None:
                context.detach(token)

    def _request(self, method: str, route: str, fn: Handler, args: tuple[Any, ...],
                 attrs: dict[str, Any]) -> Outcome:  # fmt: skip
        with self._span(f"{method} {route}", SpanKind.SERVER, attrs) as server:
            with self._span(fn.__name__, SpanKind.INTERNAL, code_attributes(fn)) as span:
                outcome, exc = self._call(span, fn, args)
            server.set_attribute("http.response.status_code", outcome.status)
            if exc is not None and outcome.status >= 500:
                _fail(server, exc)
        return outcome

    def job(self, fn: Handler, *args: Any) -> Outcome:
        with self._span(f"job {fn.__name__}", SpanKind.INTERNAL, code_attributes(fn)) as span:
            outcome, _ = self._call(span, fn, args)
        return outcome
