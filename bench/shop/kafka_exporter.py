"""A ``SpanExporter`` that writes spans to Kafka exactly as the OTel Collector's ``kafka`` exporter does with
``encoding: otlp_proto`` and ``partition_traces_by_id: true``.

Each export batch is split by trace id; every part becomes one message whose value is
``encode_spans(part).SerializeToString()`` (``TracesData`` bytes, byte-identical to an
``ExportTraceServiceRequest``) and whose key is the 32-char lowercase hex trace id.

The SDK calls ``export`` from its worker thread, so the aiokafka producer lives on a private asyncio loop in a
dedicated thread and ``export`` waits for the broker's acks. ``shutdown`` flushes and stops the producer.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


def messages(spans: Sequence[ReadableSpan]) -> list[tuple[bytes, bytes]]:
    """(key, value) per trace id, in first-seen order: the collector's ``partition_traces_by_id``."""
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    return [
        (format(trace_id, "032x").encode(), encode_spans(part).SerializeToString())
        for trace_id, part in by_trace.items()
    ]


class KafkaSpanExporter(SpanExporter):
    """Spans → Kafka topic ``topic`` (default ``otlp_spans``), one message per trace id per batch."""

    def __init__(self, bootstrap: str, topic: str = "otlp_spans", *, timeout_s: float = 30.0) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kafka-span-exporter", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._producer: AIOKafkaProducer = self._call(self._start(bootstrap))
        except BaseException:
            self._stop_loop()
            raise

    async def _start(self, bootstrap: str) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                    linger_ms=5, max_request_size=16 * 1024 * 1024)  # fmt: skip
        await producer.start()
        return producer

    def _call(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(self.timeout_s)

    async def _send(self, batch: list[tuple[bytes, bytes]]) -> None:
        acks = [await self._producer.send(self.topic, value, key=key) for key, value in batch]
        await asyncio.gather(*acks)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        try:
            self._call(self._send(messages(spans)))
        except Exception:  # the SDK logs nothing useful for us; a failed batch is reported, not raised
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._closed:
            return True
        try:
            self._call(self._producer.flush())
        except Exception:
            return False
        return True

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._producer.stop())  # stop() flushes what is still buffered
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout_s)
        self._loop.close()
