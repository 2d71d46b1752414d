"""What a columnar stage 1 could cost in pure Python: a probe for the stage issue 37 describes, not a stage.

    .venv/bin/python -m bench.columnar_probe [--spans N] [--shape bench|collector] [--rounds R]

Over the same generated messages, in one process, CPU seconds (``time.process_time``) per span of:

- ``floor``: the bench's floor (``bench.run.bench_walk``: parse + read every span's core fields);
- ``columnar``: parse, each span's core fields and its resource's service into one tuple, grouped by trace, then per
  trace: per (service, operation) count, summed duration, errors and a log2 duration histogram, and the
  cross-service CALLS pairs (parent service/operation → child) with their counts. No ``Span`` object, no detail,
  no SQL, no detector, no graph row: what every span needs, the least a columnar stage would do for the 90 % of
  spans no detector reads;
- ``stage``: the daemon's stage 1 as it is (``bench.run.run_stage``: decode, details, assembly, SQL, detectors,
  windows, graph rows, internal messages).

Its answer is a ratio: if ``columnar`` alone is a large share of 1 / 0.15 of the floor (the issue's stage target),
pure Python cannot reach that target and the stage needs native code for its per-span work.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from typing import Any

from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench.otlp_gen import Generated, generate_run

ERROR = 2  # Status.STATUS_CODE_ERROR
SERVICE = "service.name"


class Columns:
    """One probe pass's results: traces, per (service, operation) figures and CALLS pairs."""

    def __init__(self) -> None:
        self.spans = 0
        self.traces: dict[bytes, list[tuple[Any, ...]]] = defaultdict(list)
        # (service, operation) -> [count, summed duration ns, errors, {log2 duration: count}]
        self.stats: dict[tuple[str, str], list[Any]] = {}
        self.calls: dict[tuple[str, str, str, str], int] = defaultdict(int)


def _service(resource: Any) -> str:
    for kv in resource.attributes:
        if kv.key == SERVICE:
            return str(kv.value.string_value)
    return ""


def columnar(gen: Generated) -> Columns:
    """The probe's pass over ``gen``'s messages (see the module's docstring)."""
    out = Columns()
    traces, parse = out.traces, TracesData.FromString
    for message in gen.messages:
        for rs in parse(message).resource_spans:
            service = _service(rs.resource)
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    traces[sp.trace_id].append(
                        (
                            sp.span_id,
                            sp.parent_span_id,
                            service,
                            sp.name,
                            sp.end_time_unix_nano - sp.start_time_unix_nano,
                            sp.status.code,
                        )
                    )
                    out.spans += 1
    stats, calls = out.stats, out.calls
    for spans in traces.values():
        by_id = {s[0]: s for s in spans}
        for _span_id, parent_id, service, name, duration, code in spans:
            figures = stats.get((service, name))
            if figures is None:
                figures = stats[service, name] = [0, 0, 0, defaultdict(int)]
            figures[0] += 1
            figures[1] += duration
            figures[2] += code == ERROR
            figures[3][duration.bit_length()] += 1
            parent = by_id.get(parent_id)
            if parent is not None and parent[2] != service:
                calls[parent[2], parent[3], service, name] += 1
    return out


def _cpu_per_span(run: Any, spans: int) -> float:
    begin = time.process_time()
    run()
    return (time.process_time() - begin) / spans * 1e6


def probe(spans: int, shape: str, rounds: int) -> dict[str, Any]:
    """Median CPU µs per span of the floor, the columnar pass and the stage, alternated ``rounds`` times."""
    from bench.run import bench_walk, run_stage, settings_env
    from streamer import config

    gen = generate_run(spans, 300, 1, partitions=2, shape=shape)
    settings = config.load(None, env=settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "probe", "probe", 0, []))
    runs = {
        "floor": lambda: bench_walk(gen),
        "columnar": lambda: columnar(gen),
        "stage": lambda: run_stage(gen, settings, keep=False),
    }
    seen: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            seen[name].append(_cpu_per_span(run, gen.spans))
    median = {name: sorted(xs)[len(xs) // 2] for name, xs in seen.items()}
    return {
        "shape": shape,
        "spans": gen.spans,
        "cpu_us_per_span": {name: round(v, 2) for name, v in median.items()},
        "columnar_over_floor": round(median["columnar"] / median["floor"], 2),
        "stage_over_columnar": round(median["stage"] / median["columnar"], 1),
        "stage_target_us_per_span": round(median["floor"] / 0.15, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=60_000)
    parser.add_argument("--shape", choices=("bench", "collector"), default="bench")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.spans, args.shape, args.rounds), indent=2))


if __name__ == "__main__":
    main()
