"""OpenTelemetry set-up for one corpus scenario: the sample shop's (``bench.shop.telemetry``) with its own service.

Resource ``service.name = corpus-<scenario>``, ``service.version``, ``deployment.environment.name``; spans go
through a ``BatchSpanProcessor`` to the stock OTLP/HTTP exporter when an ``otlp_endpoint`` is given (a real
Collector, ``bench.collector``, writes them to Kafka), else to ``bench.shop.kafka_exporter.KafkaSpanExporter``
(OTLP protobuf ``TracesData``, one message per trace id per batch, keyed by the trace id, as the Collector's
``kafka`` exporter writes them);
psycopg is instrumented with ``capture_parameters=True`` (off with ``TRACE_REPRO_BENCH_CAPTURE_PARAMETERS=0``, as
stock instrumentation sends spans) and the stable database conventions
(``OTEL_SEMCONV_STABILITY_OPT_IN=database``: ``db.query.text``, ``db.statement.parameters``).

The psycopg instrumentation is process-wide: one scenario's telemetry at a time; ``shutdown`` flushes every span
to Kafka (the exporter waits for the broker's acks) and un-instruments psycopg.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Tracer

from bench.shop.kafka_exporter import KafkaSpanExporter
from bench.shop.telemetry import capture_parameters

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"


@dataclass
class Telemetry:
    provider: TracerProvider
    tracer: Tracer
    exporter: SpanExporter

    def shutdown(self) -> None:
        """Export what is still queued, stop the producer, un-instrument psycopg."""
        try:
            self.provider.shutdown()
        finally:
            PsycopgInstrumentor().uninstrument()


def start_telemetry(kafka_bootstrap: str, topic: str, service: str, *, version: str = "1.0.0",
                    environment: str = "corpus", otlp_endpoint: str | None = None) -> Telemetry:  # fmt: skip
    """A tracer provider exporting as ``service`` to ``topic``, or to the Collector at ``otlp_endpoint`` (its
    OTLP/HTTP base URL), and psycopg instrumented against it."""
    instrumentor = PsycopgInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        raise RuntimeError("psycopg is already instrumented: shut the other telemetry down first")
    wanted = {v.strip() for v in os.environ.get(OPT_IN, "").split(",") if v.strip()}
    if not wanted & {"database", "database/dup"}:
        os.environ[OPT_IN] = ",".join(sorted(wanted | {"database"}))
    resource = Resource.create(
        {"service.name": service, "service.version": version, "deployment.environment.name": environment}
    )
    exporter: SpanExporter
    if otlp_endpoint is None:
        exporter = KafkaSpanExporter(kafka_bootstrap, topic)
    else:
        exporter = OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces")
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    instrumentor.instrument(tracer_provider=provider, capture_parameters=capture_parameters())
    return Telemetry(provider, provider.get_tracer(service, version), exporter)
