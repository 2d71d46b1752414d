"""The shop's blocked-by defect on the real PostgreSQL + Debezium: found with both code paths, gone in the fix.

ship_order holds an order's row lock across the carrier's booking (v1.0.0) while apply_discount's UPDATE of the
order waits; v1.1.0 books the carrier before its transaction. The daemon runs as the demo runs it (a subprocess on
``config/demo.toml``), with blocked-by windows short enough for a test. The fixed build's requests must appear in no
finding, and neither must the shop's other traffic (its concurrency defects and their fixes, whose lock waits are
short): buggy traffic sent after them (a later window) is the marker that every window holding them has closed. Run
with the statements' parameters on the spans and with stock instrumentation (none).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from bench.demo import REPO, TABLES, daemon_env
from bench.shop import db
from bench.shop.evidence import Summary
from bench.shop.telemetry import CAPTURE_PARAMETERS
from bench.shop.traffic import BLOCKED_BY, run_traffic
from streamer.engines import LocalEngines
from streamer.runtime.topics import create_topics

pytestmark = pytest.mark.engines

ROUNDS = 4
SHIP, DISCOUNT = "shop.shipping.ship_order", "shop.shipping.apply_discount"


async def _events(bootstrap: str, topic: str, done: Any, timeout_s: float) -> list[dict[str, Any]]:
    """Events of ``topic`` from the start until ``done(events)`` or the deadline."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"t-{uuid.uuid4().hex[:6]}")  # fmt: skip
    await consumer.start()
    events: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while not done(events) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            events += [json.loads(m.value) for ms in batch.values() for m in ms if m.value]
    finally:
        await consumer.stop()
    return events


def _discounts(summary: Summary) -> set[str]:
    """The trace ids of the scenario's apply_discount requests (the ones that wait)."""
    return {o.trace_id for o in summary.result(BLOCKED_BY).outcomes if o.result and "update_ms" in o.result}


@pytest.mark.parametrize("parameters", [True, False], ids=["parameters", "stock_instrumentation"])
def test_the_shop_blocked_by_is_found_and_the_fixed_build_stops_it(engines: LocalEngines, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    parameters: bool) -> None:  # fmt: skip
    """With the statements' parameters on the spans, and without (stock psycopg instrumentation: the rows come from
    the row changes credited to the statements)."""
    monkeypatch.setenv(CAPTURE_PARAMETERS, "1" if parameters else "0")
    tag = uuid.uuid4().hex[:6]
    prefix = f"blk{tag}"
    dsn, bootstrap = engines.address("postgres"), engines.address("kafka")
    db.apply_schema(dsn)
    engines.capture([f"public.{t}" for t in TABLES], topic_prefix=prefix)
    topics = {role: f"{role}-{tag}" for role in ("spans", "logs", "accesses", "incidents", "repros", "verdicts",
                                                 "contracts", "dlq")}  # fmt: skip
    asyncio.run(create_topics(bootstrap, dict.fromkeys([f"{prefix}.public.{t}" for t in TABLES]
                                                       + [topics["spans"], topics["logs"]], 1)))  # fmt: skip
    env = {
        **os.environ, **engines.environment(), **daemon_env(tag, prefix, tmp_path),
        "TRACE_REPRO_REPRO__ENABLED": "false", "TRACE_REPRO_GITLAB__URL": "",
        "TRACE_REPRO_BLOCKED_BY__WINDOW_S": "2", "TRACE_REPRO_BLOCKED_BY__SETTLE_S": "0.5",
        **{f"TRACE_REPRO_KAFKA__{role.upper()}_TOPIC": name for role, name in topics.items()},
    }  # fmt: skip
    log = tmp_path / "daemon.log"
    cmd = [sys.executable, "-m", "streamer.cli", "run", "--config", str(REPO / "config" / "demo.toml")]
    with log.open("ab") as out:
        daemon = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        # The shop's other traffic (its concurrency defects and their fixes: short lock waits) must name no pair.
        run_traffic(dsn, bootstrap, scenario="all", rounds=2, topic=topics["spans"], environment="demo")
        run_traffic(dsn, bootstrap, scenario="control", rounds=2, topic=topics["spans"], environment="demo")
        runs = {}
        for name, version in (("buggy", "1.0.0"), ("fixed", "1.1.0"), ("marker", "1.0.0")):
            runs[name] = run_traffic(dsn, bootstrap, scenario=BLOCKED_BY, rounds=ROUNDS, version=version,
                                     topic=topics["spans"], environment="demo")  # fmt: skip
        waiting = {name: _discounts(summary) for name, summary in runs.items()}

        def seen(events: list[dict[str, Any]], traces: set[str]) -> bool:
            return any(traces & set(e["traces"]) for e in events if e.get("type") == "blocked_by")

        events = asyncio.run(_events(bootstrap, topics["incidents"], lambda ev: seen(ev, waiting["marker"]), 180))
    finally:
        daemon.terminate()
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    tail = log.read_text()[-3000:]
    # The shop's own evidence: each buggy discount's UPDATE waited for the carrier; no fixed one did.
    assert runs["buggy"].manifested(BLOCKED_BY) == ROUNDS and runs["fixed"].manifested(BLOCKED_BY) == 0
    findings = [e for e in events if e.get("kind") == "finding" and e.get("type") == "blocked_by"]
    assert findings, tail
    blocked = {t for f in findings for t in f["traces"]}
    assert blocked & waiting["buggy"] and not blocked & waiting["fixed"], (blocked, waiting)
    for f in findings:
        data = f["data"]
        assert (data["blocked_path"], data["blocking_path"], data["table"]) == (DISCOUNT, SHIP, "orders"), data
        assert f["remedy"] == "shorten_lock_hold" and data["median_hold_ms"] >= 250 and data["max_wait_ms"] >= 200
        assert f["contract"]["signature"] == f"finding:blocked_by:{f['fingerprint']}"
        assert f["contract"]["routes"] == ["/orders/{order_id}/discount"]
    assert len({f["fingerprint"] for f in findings}) == 1  # one pair, one fingerprint across windows and builds
    ours = {f"orders:{o}" for r in runs.values() for o in r.result(BLOCKED_BY).targets}
    collided = [e for e in events if e.get("kind") == "incident" and e["entity"] in ours]
    assert not collided, "an atomic discount beside a locking read is no collision"
