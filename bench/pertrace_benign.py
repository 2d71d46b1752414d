"""The per-trace performance detectors (N+1, serialized fan-out, retry storm) over the bench's benign traffic.

The bench's span generator (``bench.otlp_gen``) makes a healthy shop's traffic: every detector must stay silent on
it. This runs its messages through a real ``IngestStage`` built from the shipped components and the shipped event
time settings (no engines: the stage is transport-free), closes everything, and reports the findings by type, what
each detector looked at, and the stage's time with and without the three detectors.

    .venv/bin/python -m bench.pertrace_benign [--spans 300000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.otlp_gen import Generated, generate_run
from bench.run import close_all
from processors.model.finding import FindingEvent
from streamer import config
from streamer.components import default
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Record

DETECTORS = ("n_plus_one", "fanout", "retry_storm")
ENV = {"TRACE_REPRO_KAFKA__SPANS_TOPIC": "bench-spans"}


class _Clock:
    """The stage's wall clock: frozen while it works, moved on at the end so that every window closes."""

    def __init__(self) -> None:
        self.now = time.time_ns()

    def __call__(self) -> int:
        return self.now


def _timed(hook: Callable[..., None], name: str, spent: dict[str, float]) -> Callable[..., None]:
    """``hook`` adding the seconds it takes to ``spent[name]``: each detector's own cost inside the stage."""

    def timed(*args: Any) -> None:
        begin = time.perf_counter()
        try:
            hook(*args)
        finally:
            spent[name] += time.perf_counter() - begin

    return timed


def run(gen: Generated, *, detectors: bool = True, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every message through a fresh stage (settings: the shipped ones and ``env``); the findings it published by
    type (and themselves, under ``events``), what the detectors counted and dropped, and the stage's time."""
    settings = config.load(None, env={**ENV, **(env or {})})
    factories = [f for f in default().factories if detectors or f.name not in DETECTORS]
    clock, metrics, tracker = _Clock(), Metrics(), PinTracker()
    processors = stage_processors(settings, metrics, clock, "ingest", tracker, factories)
    stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=processors)
    spent = {p.name: 0.0 for p, _ in processors if p.name in DETECTORS}
    for p, _ in processors:
        if p.name in spent:
            p.on_trace = _timed(p.on_trace, p.name, spent)  # type: ignore[method-assign]
    ts = gen.start_ns // 1_000_000
    records = [Record(settings.kafka.spans_topic, 0, i, None, m, ts) for i, m in enumerate(gen.messages)]
    findings: Counter[str] = Counter()
    events: list[FindingEvent] = []
    dead = 0
    begin, cpu = time.perf_counter(), time.process_time()
    for i in range(0, len(records), settings.kafka.max_poll_records):
        out = stage.process(records[i : i + settings.kafka.max_poll_records])
        events += (e for e in out.events if isinstance(e, FindingEvent))
        dead += sum(1 for m in out.produce if m.topic == settings.kafka.dlq_topic)
    clock.now += 3600 * 1_000_000_000
    for out in close_all(stage):
        events += (e for e in out.events if isinstance(e, FindingEvent))
    findings.update(e.type for e in events)
    seconds, cpu_s = time.perf_counter() - begin, time.process_time() - cpu
    looked = {p.name: dict(p.telemetry.events) for p, _ in processors if p.name in DETECTORS}  # type: ignore[attr-defined]
    dropped = {p.name: dict(p.telemetry.dropped) for p, _ in processors if p.name in DETECTORS}  # type: ignore[attr-defined]
    assert dead == 0 and len(stage.traces) == 0, (dead, len(stage.traces))
    hit = {k: {r: n for r, n in v.items() if n} for k, v in dropped.items()}
    own = {name: round(t / max(1, gen.spans) * 1e6, 3) for name, t in spent.items()}
    return {"spans": gen.spans, "findings": dict(findings), "events": events, "seconds": round(seconds, 3),
            "cpu_s": round(cpu_s, 3), "on_trace_us_per_span": own, "counted": looked, "dropped": hit}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=300_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gen = generate_run(args.spans, seed=args.seed)  # from now: spans ahead of the wall clock are dead-lettered
    without, with_them = run(gen, detectors=False), run(gen)
    del without["events"], with_them["events"]
    extra_us = (with_them["cpu_s"] - without["cpu_s"]) / gen.spans * 1e6  # CPU: the machine may be shared
    print(json.dumps({"with_detectors": with_them, "without": without, "extra_us_per_span": round(extra_us, 2)},
                     indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
