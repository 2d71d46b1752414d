"""The sample shop: a small PostgreSQL-backed service with three real concurrency defects, instrumented with the
OpenTelemetry SDK and ``opentelemetry-instrumentation-psycopg``, exporting spans to Kafka as the OTel Collector's
``kafka`` exporter would. A workload for the daemon, not part of it.

Modules: ``schema.sql`` / ``db`` (schema, seeds), ``kafka_exporter`` (the SpanExporter), ``telemetry`` (SDK and
psycopg instrumentation), ``service`` (request and job spans), ``handlers`` / ``jobs`` (the code under test),
``traffic`` (concurrent rounds released by a barrier) and ``evidence`` (what the database shows afterwards).
Run it with ``python -m bench.shop --help``.
"""
