"""``trace-repro deploy mark``: tell the proof judge a service was deployed, for services that name no build.

    trace-repro deploy mark --service checkout [--at 2026-12-06T03:00:00Z | --at 1796526000] [--name v42]

A build is identified by ``service.version``, else by the deploy's commit (``vcs.ref.head.revision``), else by its
image digest; a service whose telemetry carries none of these is told apart only by marks: from ``--at`` (default:
now) on, its telemetry counts for the build ``--name`` (default ``deploy@<UTC time>``). The mark is published on
``trace-repro.contracts`` (keyed by service), the control topic the daemon's proof desk consumes already
(:mod:`processors.connectors.proofs.marks`). ``--dry-run`` prints it instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from processors.connectors.proofs.marks import DeployMark
from sinks.kafka.config import KafkaConfig
from streamer import config
from streamer.contract_cli import CONTRACTS_TOPIC, Publish, kafka_publish


def parse_at(text: str | None, now_s: float) -> float:
    """``--at`` in Unix ms: ISO 8601 (a naive time is UTC) or Unix seconds; ``now_s`` when absent."""
    if not text:
        return now_s * 1000
    try:
        return float(text) * 1000
    except ValueError:
        pass
    at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.timestamp() * 1000


def _arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True)
    mark = actions.add_parser("mark", help="mark a deploy of a service whose telemetry names no build")
    mark.add_argument("--service", required=True, help="service.name of the deployed service")
    mark.add_argument("--at", help="when the deploy started: ISO 8601 (UTC unless it says) or Unix seconds; now")
    mark.add_argument("--name", default="", help="the build's name (default: deploy@<UTC time>)")
    mark.add_argument("--config", type=Path, help="daemon config (for the Kafka bootstrap and security)")
    mark.add_argument("--bootstrap", help="Kafka bootstrap servers, PLAINTEXT (default: the [kafka] section)")
    mark.add_argument("--topic", default=CONTRACTS_TOPIC)
    mark.add_argument("--dry-run", action="store_true", help="print the mark, publish nothing")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Mount ``deploy`` on a ``trace-repro`` sub-parser set; the parsed args carry ``handler``."""
    p = sub.add_parser("deploy", help="mark deploys of services that name no build")
    _arguments(p)
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace, publish: Publish | None = None, clock: Callable[[], float] = time.time) -> int:
    """``deploy mark`` on parsed arguments: 0 published, 2 bad arguments or configuration."""
    try:
        mark = DeployMark(service=args.service, at_unix_ms=parse_at(args.at, clock()), name=args.name)
    except (ValueError, ValidationError) as exc:
        print(f"trace-repro deploy: {exc}", file=sys.stderr)
        return 2
    body = mark.model_dump_json()
    if args.dry_run:
        print(json.dumps(json.loads(body), indent=2))
        return 0
    kafka: str | KafkaConfig = args.bootstrap
    if not kafka:
        try:
            kafka = config.load(args.config).kafka
        except config.ConfigError as exc:
            print(f"trace-repro deploy: {exc}", file=sys.stderr)
            return 2
    asyncio.run((publish or kafka_publish)(kafka, args.topic, mark.service.encode(), body.encode()))
    print(f"published deploy mark {mark.build!r} of {mark.service} at {mark.at_unix_ms:.0f} ms on {args.topic}")
    return 0


def main(argv: Sequence[str] | None = None, publish: Publish | None = None) -> int:
    """``trace-repro deploy`` on its own."""
    p = argparse.ArgumentParser(prog="trace-repro deploy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _arguments(p)
    return run(p.parse_args(argv), publish)


if __name__ == "__main__":
    sys.exit(main())
