"""The findings counters: incidents, regressions and verdicts labelled by service, with a bounded service label."""

from __future__ import annotations

from prometheus_client import generate_latest

from streamer.runtime.metrics import OTHER_SERVICE, Metrics
from tests.finding_samples import SAMPLE_TYPE, finding
from tests.gitlab.helpers import incident, regression, verdict


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value = metrics.registry.get_sample_value(name, labels)
    return value


def test_findings_are_counted_by_service_kind_and_outcome() -> None:
    """An incident counts under its culprit's service, a regression under its service and metric, a verdict under its
    service and outcome; ``trace_repro_build_info`` is 1 for the running version."""
    metrics = Metrics()
    lost = incident()
    metrics.finding(lost)
    metrics.finding(regression("latency", service="billing"))
    metrics.finding(verdict(service="billing", outcome="WORSE"))
    metrics.finding(verdict(service="billing", outcome="WORSE"))
    assert sample(metrics, "trace_repro_incidents_total", severity=lost.severity, anomaly=lost.anomaly,
                  service=lost.culprit.service) == 1  # fmt: skip
    assert sample(metrics, "trace_repro_regressions_total", service="billing", metric="latency") == 1
    assert sample(metrics, "trace_repro_verdicts_total", service="billing", outcome="WORSE") == 2
    assert b"trace_repro_build_info{version=" in generate_latest(metrics.registry)


def test_the_service_label_is_bounded_and_the_overflow_is_a_counted_drop() -> None:
    """Past ``max_service_labels`` distinct services, later ones count as ``other`` and each is a counted drop."""
    metrics = Metrics(max_service_labels=2)
    for service in ("a", "b", "c", "d", "a"):
        metrics.finding(regression("errors", service=service))
    assert sample(metrics, "trace_repro_regressions_total", service="a", metric="errors") == 2
    assert sample(metrics, "trace_repro_regressions_total", service="b", metric="errors") == 1
    assert sample(metrics, "trace_repro_regressions_total", service=OTHER_SERVICE, metric="errors") == 2
    assert sample(metrics, "trace_repro_regressions_total", service="c", metric="errors") is None
    assert sample(metrics, "trace_repro_dropped_total", component="metrics", reason="service_label_overflow") == 2


def test_findings_of_registered_types_are_counted_by_type_with_a_bounded_label() -> None:
    """A finding of a registered type counts under its type, severity and subject's service; one of a type this build
    did not register counts as type ``other`` (the type label holds registered types only)."""
    metrics = Metrics()
    metrics.finding(finding("o1"))
    metrics.finding(finding("o2"))
    metrics.finding(finding("o3", type="made_up_by_a_newer_build"))
    assert (
        sample(metrics, "trace_repro_findings_total", type=SAMPLE_TYPE.name, severity="high", service="checkout") == 2
    )
    assert sample(metrics, "trace_repro_findings_total", type="other", severity="high", service="checkout") == 1
    assert sample(metrics, "trace_repro_findings_total", type="made_up_by_a_newer_build", severity="high",
                  service="checkout") is None  # fmt: skip
