"""``python -m bench.shop``: apply the schema, seed, run concurrent traffic, flush the spans, print the summary."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from opentelemetry import trace

from bench.shop.telemetry import start_telemetry
from bench.shop.traffic import SCENARIOS, run_traffic


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shop", description=__doc__)
    p.add_argument("--dsn", required=True, help="PostgreSQL DSN, e.g. postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--kafka", required=True, help="Kafka bootstrap servers")
    p.add_argument("--scenario", choices=SCENARIOS, default="all")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--clean", action="store_true", help="run the fixed variants")
    p.add_argument("--version", default="1.0.0", help="service.version resource attribute")
    p.add_argument("--revision", default="local", help="vcs.ref.head.revision resource attribute")
    p.add_argument("--environment", default="bench", help="deployment.environment.name resource attribute")
    p.add_argument("--topic", default="otlp_spans")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = p.parse_args(argv)
    # As a service's main does: its tracer provider is the process's, so code that asks the OpenTelemetry API for a
    # tracer (a repair's promised event, ``trace.get_tracer(...)``) exports through it too.
    telemetry = start_telemetry(a.kafka, topic=a.topic, version=a.version, environment=a.environment,
                                revision=a.revision)  # fmt: skip
    trace.set_tracer_provider(telemetry.provider)
    try:
        summary = run_traffic(a.dsn, a.kafka, scenario=a.scenario, rounds=a.rounds, version=a.version, clean=a.clean,
                              topic=a.topic, environment=a.environment, revision=a.revision,
                              telemetry=telemetry)  # fmt: skip
    finally:
        telemetry.shutdown()
    if a.json:
        out = [{"scenario": r.scenario, "clean": r.clean, "rounds": r.rounds, **r.evidence,
                "statuses": r.statuses, "error_traces": r.error_traces} for r in summary.results]  # fmt: skip
        print(json.dumps({"version": summary.version, "topic": summary.topic, "scenarios": out}, indent=2))
    else:
        print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
