"""OTLP test data made with the OpenTelemetry SDK itself and encoded with the SDK's own OTLP encoder."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode


class ShopTelemetry:
    """A tiny instrumented 'shop': each call records one request trace as the SDK would export it."""

    def __init__(self, service: str = "checkout", version: str = "1.0.0") -> None:
        self.exporter = InMemorySpanExporter()
        resource = Resource.create(
            {"service.name": service, "service.version": version, "deployment.environment.name": "test"}
        )
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("shop")

    def request(
        self,
        route: str,
        *,
        statements: Sequence[tuple[str, str]] = (),
        error: bool | BaseException = False,
        function: str = "handler",
        start_ns: int | None = None,
    ) -> None:
        """One server span with an internal handler span and a DB client span per (sql, params repr)."""
        t = start_ns
        with self.tracer.start_as_current_span(
            f"POST {route}", kind=SpanKind.SERVER, start_time=t, end_on_exit=False
        ) as server:
            server.set_attribute("http.route", route)
            with self.tracer.start_as_current_span(function, start_time=t and t + 1_000, end_on_exit=False) as handler:
                handler.set_attribute("code.function.name", function)
                handler.set_attribute("code.file.path", "shop/app.py")
                for i, (sql, params) in enumerate(statements):
                    start = t and t + 10_000 * (i + 1)
                    db = self.tracer.start_span("db", kind=SpanKind.CLIENT, start_time=start)
                    db.set_attribute("db.system.name", "postgresql")
                    db.set_attribute("db.query.text", sql)
                    db.set_attribute("db.statement.parameters", params)
                    db.end(end_time=start and start + 5_000)
                handler.end(end_time=t and t + 900_000)
            if error:
                server.record_exception(error if isinstance(error, BaseException) else RuntimeError("boom"))
                server.set_status(Status(StatusCode.ERROR))
                server.set_attribute("http.response.status_code", 500)
            else:
                server.set_attribute("http.response.status_code", 200)
            server.end(end_time=t and t + 1_000_000)

    def take(self) -> tuple[ReadableSpan, ...]:
        spans = tuple(self.exporter.get_finished_spans())
        self.exporter.clear()
        return spans


def to_proto(spans: Sequence[ReadableSpan]) -> bytes:
    """TracesData bytes, as the collector's kafka exporter writes with ``encoding: otlp_proto``."""
    return encode_spans(spans).SerializeToString()  # type: ignore[no-any-return]


def to_json(spans: Sequence[ReadableSpan]) -> bytes:
    """OTLP/JSON as the collector writes with ``encoding: otlp_json``: ids as lowercase hex, not base64."""
    doc: dict[str, Any] = json_format.MessageToDict(encode_spans(spans))

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("traceId", "spanId", "parentSpanId"):
                if node.get(key):
                    node[key] = base64.b64decode(node[key]).hex()
            for v in node.values():
                fix(v)
        elif isinstance(node, list):
            for v in node:
                fix(v)

    fix(doc)
    return json.dumps(doc).encode()


def ids(spans: Sequence[ReadableSpan]) -> tuple[set[str], set[str]]:
    """(trace ids, span ids) as lowercase hex."""
    traces = {format(s.context.trace_id, "032x") for s in spans if s.context}
    span_ids = {format(s.context.span_id, "016x") for s in spans if s.context}
    return traces, span_ids


__all__ = ["ShopTelemetry", "ids", "to_json", "to_proto"]
