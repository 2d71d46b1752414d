"""Kept versus represented traffic: per (service, version), how many traces were kept and how many they stand for.

A trace's sampling is its root span's (``processors.model.sampling``; the first span that states one when the root
does not). Each kept trace counts once in ``kept`` and ``1 / p`` (its adjusted count) in ``represented``, under its
sampling's label (``0.1``, ``1``, ``unknown``): ``represented / kept`` is how much traffic a reader does not see,
and a build whose traces are ``unknown`` says nothing of its sampling (an SDK sampler that writes no tracestate).
The runtime exports both as ``trace_repro_traces_kept_total`` / ``trace_repro_traces_represented_total``
``{service, version, sampling}``. Bounded: at most ``max_series`` (service, version, sampling) series; a trace of
another one is counted as dropped (``max_sampled_series``) in the component's telemetry.
"""

from __future__ import annotations

from processors.api.telemetry import Telemetry
from processors.model.sampling import Sampling
from processors.model.trace import ClosedTrace

SeriesKey = tuple[str, str, str]  # (service, version, sampling label)


def trace_sampling(trace: ClosedTrace) -> Sampling:
    """The sampling its root span states, else the first span's that states one, else unknown."""
    return trace.facts.sampling


class SampledTraffic:
    """Counts of kept traces and of the traces they represent, by (service, version, sampling); see the module."""

    __slots__ = ("kept", "max_series", "represented", "telemetry")

    def __init__(self, max_series: int = 4096, telemetry: Telemetry | None = None) -> None:
        self.max_series = max_series
        self.kept: dict[SeriesKey, int] = {}
        self.represented: dict[SeriesKey, float] = {}
        self.telemetry = (telemetry or Telemetry("sampling")).declare("max_sampled_series")

    def add(self, trace: ClosedTrace) -> None:
        """Count one kept trace under its root's service and version."""
        sampling = trace_sampling(trace)
        r = trace.root.resource
        key = (r.service, r.version, sampling.label)
        if key not in self.kept and len(self.kept) >= self.max_series:
            self.telemetry.drop("max_sampled_series")
            return
        self.kept[key] = self.kept.get(key, 0) + 1
        self.represented[key] = self.represented.get(key, 0.0) + sampling.weight
