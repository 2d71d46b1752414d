"""The daemon's ``/metrics`` over several worker processes: every worker's exposition merged into one.

Each worker serves its own registry on a private port; the supervisor scrapes them all at scrape time and merges
samples with the same name and labels, so a dashboard, an alert rule or the bench reads one daemon whatever the
worker count (no ``worker`` label: a partition, a stage's state or a drop is the daemon's, and Kafka already says
which process owns a partition). Counters and histograms are summed; a worker that restarts starts its counters
at zero again, which Prometheus reads as a counter reset (``rate`` and ``increase`` handle it). Gauges are summed
(state sizes, pinned offsets, per-partition lag: a revoked partition's series is removed by its old owner), but for
those whose sum means nothing: the event-time watermark is the slowest worker's, a sink is healthy only if it is
healthy in every worker, parked if it is parked in any, and the build info is 1. ``_created`` samples keep the
earliest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

GAUGE_MIN = frozenset({"trace_repro_watermark_seconds", "trace_repro_sink_healthy"})
GAUGE_MAX = frozenset({"trace_repro_sink_parked", "trace_repro_build_info"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge(expositions: Iterable[str], extra: Iterable[Metric] = ()) -> bytes:
    """One text exposition from the workers' ``expositions`` (and the supervisor's own ``extra`` families)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, float]] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text):
            known = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            merged = values.setdefault(family.name, {})
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                old = merged.get(key)
                merged[key] = s.value if old is None else _combine(known, s.name, old, s.value)
    out = []
    for name, family in families.items():
        for (sample, labels), value in values[name].items():
            family.add_sample(sample, dict(labels), value)
        out.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged([*out, *extra]))
    return generate_latest(registry)


def _combine(family: Metric, sample: str, old: float, new: float) -> float:
    if sample.endswith("_created"):
        return min(old, new)
    if family.type == "gauge":
        if family.name in GAUGE_MIN:
            return min(old, new)
        if family.name in GAUGE_MAX:
            return max(old, new)
    return old + new
