"""``trace-repro contract add``: publish a proof contract on ``trace-repro.contracts`` (keyed by fingerprint).

    trace-repro contract add --fingerprint 3f2a... --signature "error:*:RoundingError" --must-start split.rounded \\
        [--watch-s 3600] [--min-requests N | --baseline-rate P0] [--service S] [--version V] [--issue N]

Without ``--min-requests`` the traffic floor is the zero-error rule on ``--baseline-rate`` (the defect's rate in
the buggy build), or on 1% when that is not known either. ``--dry-run`` prints the contract instead.
``--write FILE`` also writes it to a file, to commit with the merge request that proves the issue: the CI gate
(``config/gitlab-ci/trace-repro-gate.yml``) reads it from ``.trace-repro/contracts/<issue>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from pydantic import ValidationError

from processors.connectors.proofs.contracts import min_requests_for, parse_signature
from processors.model.contract import DEFAULT_ALPHA, DEFAULT_WATCH_S, ProofContract
from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig
from streamer import config

CONTRACTS_TOPIC = "trace-repro.contracts"

Publish = Callable[[str | KafkaConfig, str, bytes, bytes], Coroutine[Any, Any, None]]  # (kafka, topic, key, value)


async def kafka_publish(kafka: str | KafkaConfig, topic: str, key: bytes, value: bytes) -> None:
    """Send one message and wait for all in-sync replicas to have it (``kafka``: the ``[kafka]`` section, with its
    TLS and SASL settings, or bare bootstrap servers)."""
    section = KafkaConfig(bootstrap=kafka) if isinstance(kafka, str) else kafka
    producer = AIOKafkaProducer(**client_kwargs(section, "contracts"), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def build_contract(args: argparse.Namespace, now_ms: float) -> ProofContract:
    """The contract the arguments describe (ValueError / ValidationError when they do not make one)."""
    parse_signature(args.signature)
    min_requests = args.min_requests or min_requests_for(args.baseline_rate, args.alpha)
    return ProofContract(
        signature=args.signature,
        fingerprint=args.fingerprint,
        must_start=args.must_start,
        watch_s=args.watch_s,
        min_requests=min_requests,
        alpha=args.alpha,
        baseline_rate=args.baseline_rate,
        service=args.service,
        version=args.version,
        routes=args.route or [],
        reports=args.reports or [],
        issue=args.issue,
        created_unix_ms=now_ms,
    )


def _arguments(p: argparse.ArgumentParser) -> None:
    actions = p.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="publish a proof contract")
    add.add_argument("--fingerprint", required=True, help="the incident's fingerprint (the message key)")
    add.add_argument("--signature", required=True,
                     help='"error:<route>:<exception>" (route may be *) or "<anomaly>:<table>:<f>+<g>"')  # fmt: skip
    add.add_argument("--must-start", required=True, help="event name the fix must start emitting")
    add.add_argument("--watch-s", type=float, default=DEFAULT_WATCH_S, help="event time to watch a new build")
    add.add_argument("--min-requests", type=int, help="traffic floor (default: zero-error rule)")
    add.add_argument("--baseline-rate", type=float, help="the defect's rate in the buggy build (p0)")
    add.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    add.add_argument("--service", default="", help="service to watch (default: where the signature shows)")
    add.add_argument("--version", default="", help="the buggy build (default: where the signature first shows)")
    add.add_argument("--route", action="append", help="collisions: a route whose requests count (repeatable)")
    add.add_argument("--reports", action="append", help="exception type that reports the defect (repeatable)")
    add.add_argument("--issue", type=int, help="the issue the fix proves")
    add.add_argument("--config", type=Path, help="daemon config (for the Kafka bootstrap and security)")
    add.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers, PLAINTEXT (default: the [kafka] section of the config/environment)",
    )
    add.add_argument("--topic", default=CONTRACTS_TOPIC)
    add.add_argument("--dry-run", action="store_true", help="print the contract, publish nothing")
    add.add_argument("--write", type=Path, metavar="FILE", help="also write the contract (JSON) to FILE, for the gate")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Mount ``contract`` on a ``trace-repro`` sub-parser set; the parsed args carry ``handler``."""
    p = sub.add_parser("contract", help="publish proof contracts")
    _arguments(p)
    p.set_defaults(handler=run)
    return p


def run(args: argparse.Namespace, publish: Publish | None = None, clock: Callable[[], float] = time.time) -> int:
    """``contract add`` on parsed arguments: 0 published, 2 bad arguments or configuration."""
    try:
        contract = build_contract(args, clock() * 1000)
    except (ValueError, ValidationError) as exc:
        print(f"trace-repro contract: {exc}", file=sys.stderr)
        return 2
    body = contract.model_dump_json()
    if args.write is not None:
        try:
            args.write.parent.mkdir(parents=True, exist_ok=True)
            args.write.write_text(json.dumps(json.loads(body), indent=2) + "\n")
        except OSError as exc:
            print(f"trace-repro contract: {exc}", file=sys.stderr)
            return 2
    if args.dry_run:
        print(json.dumps(json.loads(body), indent=2))
        return 0
    kafka: str | KafkaConfig = args.bootstrap
    if not kafka:
        try:
            kafka = config.load(args.config).kafka
        except config.ConfigError as exc:
            print(f"trace-repro contract: {exc}", file=sys.stderr)
            return 2
    asyncio.run((publish or kafka_publish)(kafka, args.topic, contract.fingerprint.encode(), body.encode()))
    c = contract
    print(f"published contract {c.signature} for {c.fingerprint} on {args.topic} "
          f"(must start {c.must_start!r}, {c.min_requests} requests, watch {c.watch_s:g}s)")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None, publish: Publish | None = None) -> int:
    """``trace-repro contract`` on its own."""
    p = argparse.ArgumentParser(prog="trace-repro contract", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _arguments(p)
    return run(p.parse_args(argv), publish)


if __name__ == "__main__":
    sys.exit(main())
