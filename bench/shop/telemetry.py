"""OpenTelemetry set-up for the shop: resource, ``KafkaSpanExporter`` behind a ``BatchSpanProcessor`` and the
psycopg instrumentation with ``capture_parameters=True`` (``TRACE_REPRO_BENCH_CAPTURE_PARAMETERS=0``: ``False``,
the instrumentation's default, as a service nobody tuned sends its spans) and the stable database conventions.

With ``OTEL_SEMCONV_STABILITY_OPT_IN=database`` the psycopg client spans carry ``db.system.name``,
``db.namespace`` and ``db.query.text`` (the statement with its ``%s`` placeholders) and, with
``capture_parameters``, ``db.statement.parameters`` (``str()`` of the parameter tuple).

A request's idempotency key travels as baggage (``app.idempotency_key``) and :class:`RequestBaggage` stamps it on
every span the request starts, its statements' included (OpenTelemetry's baggage span processor pattern), which is
where the daemon reads it (``[decode] idempotency_key_attribute``).

The instrumentor is process-wide: one ``Telemetry`` at a time; ``shutdown`` un-instruments psycopg and flushes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from opentelemetry import baggage
from opentelemetry.context import Context
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Tracer

from bench.shop.kafka_exporter import KafkaSpanExporter

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
REQUEST_BAGGAGE = ("app.idempotency_key",)  # request facts copied onto every span of the request


class RequestBaggage(SpanProcessor):
    """Stamps the request's baggage entries (``REQUEST_BAGGAGE``) on each span started in its context."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for name in REQUEST_BAGGAGE:
            value = baggage.get_baggage(name, parent_context)
            if isinstance(value, str) and value:
                span.set_attribute(name, value)


@dataclass
class Telemetry:
    """The shop's tracer and what must be flushed and stopped at the end."""

    provider: TracerProvider
    tracer: Tracer
    exporter: KafkaSpanExporter

    def flush(self) -> bool:
        return self.provider.force_flush()

    def shutdown(self) -> None:
        """Un-instrument psycopg, export what is still queued, stop the Kafka producer."""
        PsycopgInstrumentor().uninstrument()
        self.provider.shutdown()


CAPTURE_PARAMETERS = "TRACE_REPRO_BENCH_CAPTURE_PARAMETERS"


def capture_parameters() -> bool:
    """Whether psycopg spans carry their statements' parameters (``TRACE_REPRO_BENCH_CAPTURE_PARAMETERS``, on unless
    ``0``): the shop and the corpus record them; stock instrumentation does not."""
    return os.environ.get(CAPTURE_PARAMETERS, "1").strip() != "0"


def _opt_in_database() -> None:
    wanted = {v.strip() for v in os.environ.get(OPT_IN, "").split(",") if v.strip()}
    if not wanted & {"database", "database/dup"}:
        os.environ[OPT_IN] = ",".join(sorted(wanted | {"database"}))


def start_telemetry(
    kafka_bootstrap: str,
    *,
    topic: str = "otlp_spans",
    version: str = "1.0.0",
    environment: str = "bench",
    revision: str = "local",
    schedule_delay_ms: int = 200,
) -> Telemetry:
    """Tracer provider exporting to ``topic``, and psycopg instrumented against it."""
    instrumentor = PsycopgInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        raise RuntimeError("psycopg is already instrumented: shut the other Telemetry down first")
    _opt_in_database()
    resource = Resource.create(
        {
            "service.name": "shop",
            "service.version": version,
            "deployment.environment.name": environment,
            "vcs.ref.head.revision": revision,
        }
    )
    exporter = KafkaSpanExporter(kafka_bootstrap, topic)
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(RequestBaggage())
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_ms))
    instrumentor.instrument(tracer_provider=provider, capture_parameters=capture_parameters())
    return Telemetry(provider, provider.get_tracer("shop", version), exporter)
