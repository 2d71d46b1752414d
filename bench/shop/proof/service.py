"""The split service's requests as OTel spans and its must-start event as OTel log records, both to Kafka.

Spans go through the shop's ``KafkaSpanExporter`` (the collector's ``kafka`` exporter, ``otlp_proto``). Log
records go through ``KafkaLogExporter``: one ``LogsData`` message per export batch (``ExportLogsServiceRequest``
bytes, which are ``LogsData`` bytes), what the collector writes for logs. The fix's event is emitted twice: as a
log record with ``event_name`` (what the proof judge counts) and as a span event on the handler span.

A request is a SERVER span ``POST <route>`` with an INTERNAL handler span carrying ``code.*``; a failure (500)
records the exception on both and sets status ERROR, as ``bench.shop.service`` does.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry import context as otel_context
from opentelemetry._logs import Logger, SeverityNumber
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import LogRecordExporter, LogRecordExportResult, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from bench.shop.kafka_exporter import KafkaSpanExporter
from bench.shop.proof.split import Build, split_custom, split_even
from bench.shop.service import code_attributes

EVENT = "split.rounded"
SERVICE = "split"


def revision_of(version: str) -> str:
    """A stable fake commit id per build (``vcs.ref.head.revision``)."""
    return hashlib.sha1(f"split-{version}".encode()).hexdigest()[:12]


class KafkaLogExporter(LogRecordExporter):
    """Log records -> Kafka topic ``topic``, one ``LogsData`` message per export call."""

    def __init__(self, bootstrap: str, topic: str, *, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-log-exporter", daemon=True)
        self._thread.start()
        self._closed = False
        self._producer: AIOKafkaProducer = self._call(self._start(bootstrap))

    async def _start(self, bootstrap: str) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
        await producer.start()
        return producer

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(self.timeout_s)

    def export(self, batch: Sequence[ReadableLogRecord]) -> LogRecordExportResult:
        if self._closed:
            return LogRecordExportResult.FAILURE
        try:
            self._call(self._producer.send_and_wait(self.topic, encode_logs(batch).SerializeToString()))
        except Exception:
            return LogRecordExportResult.FAILURE
        return LogRecordExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # export waits for the broker's acks

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._producer.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout_s)
            self._loop.close()


@dataclass
class BuildTelemetry:
    """One build's tracer and logger (resource: service.name, service.version, vcs.ref.head.revision)."""

    version: str
    tracer: Tracer
    logger: Logger
    spans: TracerProvider
    logs: LoggerProvider

    def shutdown(self) -> None:
        """Export what is queued and stop both producers."""
        self.spans.shutdown()
        self.logs.shutdown()


def start_build(bootstrap: str, version: str, *, spans_topic: str, logs_topic: str,
                sampler: Sampler | None = None) -> BuildTelemetry:  # fmt: skip
    resource = Resource.create({"service.name": SERVICE, "service.version": version,
                                "deployment.environment.name": "proof",
                                "vcs.ref.head.revision": revision_of(version)})  # fmt: skip
    spans = TracerProvider(resource=resource, sampler=sampler)
    spans.add_span_processor(BatchSpanProcessor(KafkaSpanExporter(bootstrap, spans_topic), schedule_delay_millis=100))
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(SimpleLogRecordProcessor(KafkaLogExporter(bootstrap, logs_topic)))
    return BuildTelemetry(version, spans.get_tracer(SERVICE, version), logs.get_logger(SERVICE, version), spans, logs)


def _fail(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute("error.type", type(exc).__qualname__)


class SplitService:
    """One build of the service, answering requests as traced spans."""

    def __init__(self, build: Build, telemetry: BuildTelemetry) -> None:
        self.build = build
        self.telemetry = telemetry
        self.rounded = 0  # must-start events emitted

    def _rounded(self, span: Span) -> Callable[[int], None]:
        def rounded(leftover: int) -> None:
            self.rounded += 1
            span.add_event(EVENT, {"split.leftover_cents": leftover})
            self.telemetry.logger.emit(timestamp=time.time_ns(), context=otel_context.get_current(),
                                       severity_number=SeverityNumber.INFO, body=f"distributed {leftover} cent(s)",
                                       event_name=EVENT, attributes={"split.leftover_cents": leftover})  # fmt: skip

        return rounded

    def request(self, route: str, total: int, parts: list[int], currency: str) -> tuple[int, str]:
        """One ``POST /split/<route>``: (HTTP status, exception type or "")."""
        fn = split_even if route == "even" else split_custom
        path = f"/split/{route}"
        tracer = self.telemetry.tracer
        attrs = {"http.request.method": "POST", "http.route": path, "url.path": path}
        with tracer.start_as_current_span(f"POST {path}", kind=SpanKind.SERVER, attributes=attrs,
                                          record_exception=False, set_status_on_exception=False) as server:  # fmt: skip
            error: Exception | None = None
            with tracer.start_as_current_span(fn.__name__, attributes=code_attributes(fn), record_exception=False,
                                              set_status_on_exception=False) as span:  # fmt: skip
                try:
                    if route == "even":
                        split_even(self.build, total, len(parts), currency, self._rounded(span))
                    else:
                        split_custom(self.build, total, parts, currency, self._rounded(span))
                except Exception as exc:
                    error = exc
                    _fail(span, exc)
            server.set_attribute("http.response.status_code", 500 if error else 200)
            if error is not None:
                _fail(server, error)
        return (500, type(error).__name__) if error else (200, "")
