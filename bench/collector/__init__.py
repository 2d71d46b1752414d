"""A stock OpenTelemetry Collector for the tests: built once from pinned sources, run on a test's Kafka and topics.

``builder-config.yaml`` and ``otelcol/`` (the Collector Builder's output, ``go.sum`` committed) say what it is;
:mod:`~bench.collector.toolchain` finds a Go, :mod:`~bench.collector.build` compiles and caches the binary, and
:mod:`~bench.collector.process` runs it on the shipped ``config/otel-collector.yaml`` with a test's addresses.
The daemon never needs any of it: it only reads what the Collector writes to Kafka.
"""
