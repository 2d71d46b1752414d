"""The daemon's own Prometheus metrics, on a registry per daemon (so tests can run several in one process).

Names follow Prometheus conventions: ``trace_repro_`` prefix, ``_total`` for counters, base units (seconds,
bytes), the unit in the name (``_seconds``, ``_messages``, ``_events``). The runtime's own series are
prometheus-client objects; every component's telemetry (``processors.api.telemetry.Telemetry``: drops by reason, events,
state gauges) is read at scrape time by :class:`ComponentCollector` and exported with the component's name: every
drop of the daemon is ``trace_repro_dropped_total{component, reason}``.

The findings counters (incidents, regressions, findings of the registered types by type, verdicts) carry a
``service`` label for alert routing, bounded by :class:`ServiceLabels` (the ``http.max_service_labels`` setting);
``trace_repro_build_info`` lets alert rules find the daemon's targets whatever their scrape job is called.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from processors.api.telemetry import Telemetry
from processors.model.finding import FINDING_TYPES
from processors.pipeline.sampled_traffic import SampledTraffic
from streamer.version import __version__


class Telemetries:
    """One :class:`Telemetry` per component name, shared by whoever asks for that name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Telemetry] = {}

    def __call__(self, component: str) -> Telemetry:
        telemetry = self._by_name.get(component)
        if telemetry is None:
            telemetry = self._by_name[component] = Telemetry(component)
        return telemetry

    def all(self) -> list[Telemetry]:
        return list(self._by_name.values())


class ComponentCollector(Collector):
    """Every component's telemetry as Prometheus families, read when scraped (dict copies: no lock needed)."""

    def __init__(self, telemetries: Telemetries) -> None:
        self.telemetries = telemetries

    def collect(self) -> Iterator[Metric]:
        dropped = CounterMetricFamily("trace_repro_dropped", "Events dropped, by component and reason",
                                      labels=["component", "reason"])  # fmt: skip
        events = CounterMetricFamily("trace_repro_component_events", "Events a component counted",
                                     labels=["component", "event"])  # fmt: skip
        state = GaugeMetricFamily("trace_repro_component_state", "A component's state size",
                                  labels=["component", "state"])  # fmt: skip
        for t in self.telemetries.all():
            for reason, n in dict(t.dropped).items():
                dropped.add_metric([t.component, reason], n)
            for event, n in dict(t.events).items():
                events.add_metric([t.component, event], n)
            for name, value in dict(t.state).items():
                state.add_metric([t.component, name], value)
        yield dropped
        yield events
        yield state

    def describe(self) -> Iterator[Metric]:
        return iter(())


class SampledTrafficCollector(Collector):
    """Kept and represented traces (``processors.pipeline.sampled_traffic``) by service, version and sampling, when
    scraped."""

    def __init__(self, traffic: SampledTraffic) -> None:
        self.traffic = traffic

    def collect(self) -> Iterator[Metric]:
        labels = ["service", "version", "sampling"]
        kept = CounterMetricFamily(
            "trace_repro_traces_kept", "Traces kept (received), by their sampling", labels=labels
        )
        what = "Traces the kept ones represent (sum of 1/p, the adjusted counts; unknown sampling counts 1)"
        represented = CounterMetricFamily("trace_repro_traces_represented", what, labels=labels)
        for key, n in dict(self.traffic.kept).items():
            kept.add_metric(list(key), n)
        for key, weight in dict(self.traffic.represented).items():
            represented.add_metric(list(key), weight)
        yield kept
        yield represented

    def describe(self) -> Iterator[Metric]:
        return iter(())


class ServiceLabels:
    """The ``service`` label of the findings counters, with bounded cardinality: the first ``limit`` service names
    seen keep their name, later ones share ``other`` (counted as a drop ``service_label_overflow`` of component
    ``metrics``). Services are the deployment's own (``service.name``), so the bound is a guard against a producer
    that puts request data in the resource, not a limit a healthy deployment reaches."""

    __slots__ = ("_known", "limit", "telemetry")

    def __init__(self, limit: int, telemetry: Telemetry) -> None:
        self.limit = limit
        self.telemetry = telemetry.declare("service_label_overflow")
        self._known: set[str] = set()

    def __call__(self, service: str) -> str:
        if service in self._known:
            return service
        if len(self._known) < self.limit:
            self._known.add(service)
            return service
        self.telemetry.drop("service_label_overflow")
        return OTHER_SERVICE


OTHER_SERVICE = "other"
MAX_SERVICE_LABELS = 200
OTHER_TYPE = "other"  # the type label of a finding whose type this build did not register (the label set is bounded)
_BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    __slots__ = (
        "batch_seconds",
        "build_info",
        "committed_offset",
        "consumed",
        "correlated",
        "decoded",
        "dlq",
        "findings",
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
        "regressions",
        "sampled",
        "service_label",
        "sink_backlog",
        "sink_healthy",
        "sink_parked",
        "telemetry",
        "unkeyed",
        "verdicts",
        "watermark",
    )

    def __init__(self, registry: CollectorRegistry | None = None, max_service_labels: int = MAX_SERVICE_LABELS) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.telemetry = Telemetries()
        r.register(ComponentCollector(self.telemetry))
        self.service_label = ServiceLabels(max_service_labels, self.telemetry("metrics"))
        self.build_info = Gauge("trace_repro_build_info", "Always 1: the daemon's version (alerts select the daemon's "
                                "targets by it, whatever their job name)", ["version"], registry=r)  # fmt: skip
        self.build_info.labels(__version__).set(1)
        self.sampled = SampledTraffic(telemetry=self.telemetry("sampling"))
        r.register(SampledTrafficCollector(self.sampled))
        self.consumed = Counter("trace_repro_consumed_messages", "Kafka messages consumed", ["topic"], registry=r)
        self.decoded = Counter("trace_repro_decoded_events", "Events decoded from messages", ["kind"], registry=r)
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
            "trace_repro_incidents",
            "New incident occurrences published, by the culprit's service",
            ["severity", "anomaly", "service"],
            registry=r,
        )
        self.regressions = Counter(
            "trace_repro_regressions", "Latency or error regressions published", ["service", "metric"], registry=r
        )
        self.findings = Counter(
            "trace_repro_findings",
            "Findings of the detectors' registered types published (kind finding), by type, severity and the "
            "subject's service (a type this build did not register counts as other)",
            ["type", "severity", "service"],
            registry=r,
        )
        self.verdicts = Counter("trace_repro_verdicts", "Proof verdicts published", ["service", "outcome"], registry=r)
        self.unkeyed = Counter(
            "trace_repro_unkeyed_statements", "Statements on a table that named no row by its key (predicate "
            "accesses: a range, a non-key column, an insert whose key the database assigns, a table whose key is not "
            "known yet)", ["table"], registry=r,
        )  # fmt: skip
        self.graph_rows = Counter("trace_repro_graph_rows_written", "Rows written to the graph", registry=r)
        self.graph_retries = Counter("trace_repro_graph_write_retries", "Retried graph operations", ["op"], registry=r)
        self.graph_rejected = Counter(
            "trace_repro_graph_rows_rejected", "Rows the graph refused permanently", ["op"], registry=r
        )
        self.sink_healthy = Gauge("trace_repro_sink_healthy", "1 while a sink's last health check passed", ["sink"],
                                  registry=r)  # fmt: skip
        self.sink_parked = Gauge(
            "trace_repro_sink_parked", "1 while a sink is parked (its destination refuses it)", ["sink"], registry=r
        )
        self.sink_backlog = Gauge(
            "trace_repro_sink_backlog_messages",
            "Output messages not yet delivered by a sink (its consumer group's lag on the output topics)",
            ["sink"],
            registry=r,
        )

    def finding(self, event: Any) -> None:
        """Count one newly published finding (incidents by culprit service, regressions, findings of the registered
        types by type, verdicts)."""
        kind = getattr(event, "kind", "")
        if kind == "incident":
            self.incidents.labels(event.severity, event.anomaly, self.service_label(event.culprit.service)).inc()
        elif kind == "regression":
            self.regressions.labels(self.service_label(event.service), event.metric).inc()
        elif kind == "finding":
            known = event.type if event.type in FINDING_TYPES else OTHER_TYPE
            self.findings.labels(known, event.severity, self.service_label(event.subject.service)).inc()
        elif kind == "verdict":
            self.verdicts.labels(self.service_label(event.service), event.outcome).inc()
