"""The daemon's own Prometheus metrics, on a registry per daemon (so tests can run several in one process).

Names follow Prometheus conventions: ``trace_repro_`` prefix, ``_total`` for counters, base units (seconds,
bytes). Every drop is a labelled counter: ``trace_repro_dropped_total{component, reason}``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    __slots__ = (
        "batch_seconds",
        "committed_offset",
        "consumed",
        "correlated",
        "decoded",
        "dlq",
        "dropped",
        "graph_rejected",
        "graph_retries",
        "graph_rows",
        "graph_write_seconds",
        "incidents",
        "lag",
        "late",
        "open_traces",
        "open_windows",
        "pinned_offsets",
        "published",
        "registry",
        "watermark",
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.consumed = Counter("trace_repro_consumed_messages", "Kafka messages consumed", ["topic"], registry=r)
        self.decoded = Counter("trace_repro_decoded_events", "Events decoded from messages", ["kind"], registry=r)
        self.dropped = Counter(
            "trace_repro_dropped", "Events dropped, by component and reason", ["component", "reason"], registry=r
        )
        self.dlq = Counter("trace_repro_dlq_messages", "Messages sent to the dead-letter topic", ["reason"], registry=r)
        self.late = Counter(
            "trace_repro_late_events", "Events behind the watermark when they arrived", ["kind"], registry=r
        )
        self.published = Counter("trace_repro_published_messages", "Messages produced", ["topic"], registry=r)
        self.lag = Gauge(
            "trace_repro_consumer_lag_messages", "High watermark minus position", ["topic", "partition"], registry=r
        )
        self.committed_offset = Gauge(
            "trace_repro_committed_offset", "Last committed offset", ["topic", "partition"], registry=r
        )
        self.pinned_offsets = Gauge(
            "trace_repro_pinned_offsets", "Input messages still feeding open state", ["stage"], registry=r
        )
        self.watermark = Gauge(
            "trace_repro_watermark_seconds", "Event-time watermark (Unix seconds)", ["stage"], registry=r
        )
        self.open_traces = Gauge("trace_repro_open_traces", "Traces being assembled", registry=r)
        self.open_windows = Gauge("trace_repro_open_windows", "Aggregate windows not yet closed", registry=r)
        self.batch_seconds = Histogram(
            "trace_repro_batch_seconds",
            "Time to process one consumed batch",
            ["stage"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.graph_write_seconds = Histogram(
            "trace_repro_graph_write_seconds", "Time to write one batch to FalkorDB", buckets=_BATCH_BUCKETS, registry=r
        )
        self.correlated = Counter(
            "trace_repro_row_changes_correlated",
            "Row changes by correlation strength (none = uncorrelated)",
            ["strength"],
            registry=r,
        )
        self.incidents = Counter(
            "trace_repro_incidents", "New incident occurrences published", ["severity", "anomaly"], registry=r
        )
        for severity in ("high", "low"):  # present from the start, so increase() sees the first incident
            for anomaly in ("lost_update", "invariant_violation", "duplicate_apply", "write_skew"):
                self.incidents.labels(severity, anomaly)
        self.graph_rows = Counter("trace_repro_graph_rows_written", "Rows written to the graph", registry=r)
        self.graph_retries = Counter("trace_repro_graph_write_retries", "Retried graph operations", ["op"], registry=r)
        self.graph_rejected = Counter(
            "trace_repro_graph_rows_rejected", "Rows the graph refused permanently", ["op"], registry=r
        )
