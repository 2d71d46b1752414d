"""``trace-repro doctor``: read a sample, print the report (table or JSON); exit 2 when nothing could be read."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from streamer import config
from streamer.doctor.diagnose import diagnose
from streamer.doctor.sample import SampleError, read_sample


def doctor(args: argparse.Namespace) -> int:
    """The command. Findings are the point of it, so they do not change the exit status; an unreadable sample does."""
    try:
        settings = config.load(args.config)
    except config.ConfigError as exc:
        print(f"trace-repro doctor: {exc}", file=sys.stderr)
        return 2
    try:
        sample = asyncio.run(read_sample(settings.kafka, messages=args.messages, seconds=args.seconds,
                                         from_beginning=args.start == "beginning"))  # fmt: skip
    except SampleError as exc:
        print(f"trace-repro doctor: {exc}", file=sys.stderr)
        return 2
    if not sample.records:
        where = ", ".join(sample.topics)
        print(f"trace-repro doctor: nothing to read on {where} ({'; '.join(sample.notes) or 'the topics are empty'})",
              file=sys.stderr)  # fmt: skip
        return 2
    report = diagnose(sample.records, settings, sample.notes)
    print(report.to_json() if args.json else report.to_table())
    return 0


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(value: str) -> int | float:
        try:
            n = kind(value)
        except ValueError:
            n = 0
        if n <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
        return n

    return parse


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser("doctor", help="what the telemetry lacks per service and table, and what to turn on",
                       description="Read a sample of the configured topics (spans, logs, CDC) and say, per service "
                       "and per table, what each capability lacks and how to turn it on.")  # fmt: skip
    d.add_argument("--config", type=Path, help="the daemon's TOML config (default: TRACE_REPRO_* environment only)")
    d.add_argument("--messages", type=_positive(int), default=1000, metavar="N",
                   help="at most N messages per topic (default 1000)")  # fmt: skip
    d.add_argument("--seconds", type=_positive(float), default=10.0, metavar="S",
                   help="read for at most S seconds (default 10)")  # fmt: skip
    d.add_argument("--from", dest="start", choices=["end", "beginning"], default="end",
                   help="the latest messages (default) or the oldest retained")  # fmt: skip
    d.add_argument("--json", action="store_true", help="the report as JSON")
    d.set_defaults(handler=doctor)
