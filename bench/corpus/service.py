"""Requests as spans, the way an instrumented web framework records them, for the corpus apps.

A request is a SERVER span ``POST <route>`` (``http.request.method``, ``http.route``, ``url.path``,
``http.response.status_code``) with one INTERNAL child span for the handler (``code.function.name`` =
``corpus.<scenario>.<function>``, ``code.file.path``, ``code.line.number``); the handler's psycopg statements are
CLIENT spans under it. Each request gets its own autocommit connection and runs one transaction on it
(``conn.transaction()``: BEGIN and COMMIT are not statements, so not spans). A ``Refused`` outcome answers 409 and
leaves the spans' status UNSET (a business outcome); any other exception answers 500, sets status ERROR and records
the exception (an ``exception`` span event) on the handler span and on the server span.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

Handler = Callable[..., dict[str, Any]]


class CorpusError(Exception):
    """A failed request (500)."""

    status = 500


class Refused(CorpusError):
    """The request was refused for a business reason (409): the control variants' way of losing a race."""

    status = 409


@dataclass(frozen=True)
class Outcome:
    """What one request answered."""

    function: str
    route: str
    status: int
    trace_id: str
    result: dict[str, Any] | None = None
    error: str = ""


def function_name(scenario: str, fn: Callable[..., Any]) -> str:
    """``corpus.<scenario>.<function>``: the handler's ``code.function.name``."""
    return f"corpus.{scenario}.{fn.__name__}"


def _fail(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute("error.type", type(exc).__qualname__)


class Service:
    """Runs a scenario's handlers as traced requests against PostgreSQL (tables found through ``search_path``)."""

    def __init__(self, scenario: str, dsn: str, tracer: Tracer, *, schema: str = "public") -> None:
        self.scenario = scenario
        self.dsn = dsn
        self.tracer = tracer
        self.schema = schema

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, options=f"-c search_path={self.schema}")

    def _span(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> AbstractContextManager[Span]:
        return self.tracer.start_as_current_span(name, kind=kind, attributes=attributes, record_exception=False,
                                                 set_status_on_exception=False)  # fmt: skip

    def request(self, route: str, path: str, fn: Handler, *args: Any) -> Outcome:
        """``POST <route>`` handled by ``fn(conn, *args)``; see the module docstring."""
        name = function_name(self.scenario, fn)
        code = {"code.function.name": name, "code.file.path": inspect.getsourcefile(fn) or fn.__code__.co_filename,
                "code.line.number": fn.__code__.co_firstlineno}  # fmt: skip
        attrs = {"http.request.method": "POST", "http.route": route, "url.path": path}
        with self._span(f"POST {route}", SpanKind.SERVER, attrs) as server:
            trace_id = format(server.get_span_context().trace_id, "032x")
            failure: Exception | None = None
            with self._span(fn.__name__, SpanKind.INTERNAL, code) as handler:
                try:
                    with self.connect() as conn:
                        result = fn(conn, *args)
                    outcome = Outcome(name, route, 200, trace_id, result)
                except Exception as exc:
                    status = exc.status if isinstance(exc, CorpusError) else 500
                    outcome = Outcome(name, route, status, trace_id, error=f"{type(exc).__name__}: {exc}")
                    if status >= 500:
                        failure = exc
                        _fail(handler, exc)
            server.set_attribute("http.response.status_code", outcome.status)
            if failure is not None:
                _fail(server, failure)
        return outcome
