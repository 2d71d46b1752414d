"""Traffic for the proof scenario: the builds one after another, each with its own telemetry.

Bills are deterministic: request ``j`` alternates ``/split/even`` and ``/split/custom``; one bill in 20 per route
is an amount the parts do not divide (the rounding bug's trigger, a 5% rate); one custom bill in 5 is in CHF
(1.3's new bug). During 1.1's rollout a draining 1.0 pod keeps serving one request in ten: its failures must be
counted for 1.0, never for 1.1.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opentelemetry.sdk.trace.sampling import Sampler

from bench.shop.proof.service import BuildTelemetry, SplitService, start_build
from bench.shop.proof.split import BUILDS

PARTIES = ([1, 1], [1, 1, 1], [1, 2], [2, 3, 5], [1, 1, 1, 1])
SEQUENCE = (("0.9", 400), ("1.0", 400), ("1.1", 400), ("1.2", 400), ("1.3", 400), ("1.4", 20))
DRAINING_EVERY = 10


def bill(j: int) -> tuple[str, int, list[int], str]:
    """Request ``j``: (route, total cents, parts, currency)."""
    route = "even" if j % 2 == 0 else "custom"
    k = j // 2
    parts = PARTIES[k % len(PARTIES)]
    if route == "even":
        parts = [1] * len(parts)
    total = sum(parts) * (100 + 7 * k) + (1 if k % 20 == 7 else 0)
    currency = "CHF" if route == "custom" and k % 5 == 4 else "EUR"
    return route, total, parts, currency


@dataclass
class BuildRun:
    """What one build served: requests, statuses and exceptions by route."""

    version: str
    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, exception) -> count
    rounded: int = 0  # must-start events (log records) emitted

    def serve(self, service: SplitService, j: int) -> None:
        route, total, parts, currency = bill(j)
        status, exception = service.request(route, total, parts, currency)
        self.requests += 1
        self.statuses[status] += 1
        if exception:
            self.errors[(f"/split/{route}", exception)] += 1


def run_scenario(bootstrap: str, *, spans_topic: str, logs_topic: str,
                 sequence: tuple[tuple[str, int], ...] = SEQUENCE,
                 samplers: dict[str, Sampler] | None = None) -> dict[str, BuildRun]:  # fmt: skip
    """Run every build of ``sequence`` in order, export its spans and logs, and return what each served (a build
    in ``samplers`` exports the spans its sampler keeps)."""
    runs: dict[str, BuildRun] = {}
    telemetry: dict[str, BuildTelemetry] = {}
    try:
        services: dict[str, SplitService] = {}
        counters: dict[str, int] = {}
        for version, n in sequence:
            telemetry[version] = start_build(bootstrap, version, spans_topic=spans_topic, logs_topic=logs_topic,
                                             sampler=(samplers or {}).get(version))  # fmt: skip
            services[version] = SplitService(BUILDS[version], telemetry[version])
            runs[version] = BuildRun(version)
            counters[version] = 0
            for j in range(n):
                runs[version].serve(services[version], j)
                if version == "1.1" and "1.0" in services and j % DRAINING_EVERY == 0:
                    runs["1.0"].serve(services["1.0"], counters["1.0"] + 400)
                    counters["1.0"] += 1
            for v, service in services.items():
                runs[v].rounded = service.rounded
            if version != "1.0":
                telemetry.pop(version).shutdown()
            if version == "1.1" and "1.0" in telemetry:
                telemetry.pop("1.0").shutdown()  # the old pod is gone once 1.1 has fully rolled out
    finally:
        for t in telemetry.values():
            t.shutdown()
    return runs
