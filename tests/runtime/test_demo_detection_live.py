"""The demo's detection phase twice, with the daemon killed (SIGKILL) in between: the same three defects, the same
three fingerprints, each with one class, whatever the timing of correlation around the restart.

This is what `make demo` depends on (exactly three issues, each closed on FIXED): a defect whose class or
fingerprint changed with timing would open a fourth issue that no fix closes. The daemon runs as the demo runs it:
a subprocess on the demo's ``config/demo.toml`` with the demo's overrides (``bench.demo.daemon_env``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from bench.demo import REPO, TABLES, daemon_env
from bench.shop import db
from bench.shop.traffic import run_traffic
from streamer.engines import LocalEngines
from streamer.runtime.topics import create_topics

pytestmark = pytest.mark.engines

ROUNDS = 2
CLASSES = {"lost_update", "invariant_violation", "phantom"}


async def _incidents(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[dict[str, Any]]:
    """Incident events until ``want`` distinct occurrences have arrived: delivery is at least once, so a daemon
    killed before it committed publishes what it replays again (the same occurrence, the same content)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"t-{uuid.uuid4().hex[:6]}")  # fmt: skip
    await consumer.start()
    events: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len({e["occurrence"] for e in events}) < want and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            events += [json.loads(m.value) for ms in batch.values() for m in ms if m.value]
            events = [e for e in events if e.get("kind") == "incident"]
    finally:
        await consumer.stop()
    return events


def _daemon(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "streamer.cli", "run", "--config", str(REPO / "config" / "demo.toml")]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def test_the_demo_defects_keep_their_fingerprints_across_a_sigkill(engines: LocalEngines, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    prefix = f"demo{tag}"
    dsn, bootstrap = engines.address("postgres"), engines.address("kafka")
    db.apply_schema(dsn)
    engines.capture([f"public.{t}" for t in TABLES], topic_prefix=prefix)
    topics = {role: f"{role}-{tag}" for role in ("spans", "logs", "accesses", "incidents", "repros", "verdicts",
                                                 "contracts", "dlq")}  # fmt: skip
    asyncio.run(create_topics(bootstrap, dict.fromkeys([f"{prefix}.public.{t}" for t in TABLES]
                                                       + [topics["spans"], topics["logs"]], 1)))  # fmt: skip
    env = {
        **os.environ,
        **engines.environment(),
        **daemon_env(tag, prefix, tmp_path),
        "TRACE_REPRO_REPRO__ENABLED": "false",  # detection only: the repro worker is the demo's next phase
        "TRACE_REPRO_GITLAB__URL": "",
        **{f"TRACE_REPRO_KAFKA__{role.upper()}_TOPIC": name for role, name in topics.items()},
    }
    log = tmp_path / "daemon.log"
    daemon = _daemon(env, log)
    try:
        run_traffic(dsn, bootstrap, scenario="all", rounds=ROUNDS, topic=topics["spans"], environment="demo")
        first = asyncio.run(_incidents(bootstrap, topics["incidents"], 3 * ROUNDS, 120))
        assert len({e["occurrence"] for e in first}) == 3 * ROUNDS, log.read_text()[-3000:]
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        daemon = _daemon(env, log)
        run_traffic(dsn, bootstrap, scenario="all", rounds=ROUNDS, topic=topics["spans"], environment="demo")
        every = asyncio.run(_incidents(bootstrap, topics["incidents"], 6 * ROUNDS, 120))
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    classes: dict[str, set[str]] = defaultdict(set)
    for e in every:
        classes[e["fingerprint"]].add(e["anomaly"])
    assert len({e["occurrence"] for e in every}) == 6 * ROUNDS, log.read_text()[-3000:]
    assert {e["fingerprint"] for e in first} == set(classes), "a defect changed fingerprint across the restart"
    assert sorted(a for c in classes.values() for a in c) == sorted(CLASSES), classes
    replayed: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for e in every:  # a replay after the kill is the same finding, never a different one
        replayed[e["occurrence"]].add((e["fingerprint"], e["anomaly"], e["entity"]))
    assert all(len(v) == 1 for v in replayed.values()), replayed
