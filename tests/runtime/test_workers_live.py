"""``trace-repro run --workers 2`` on the real engines: two ingest processes of one consumer group, a supervisor.

The daemon runs as a subprocess, as an operator runs it; what each worker did is read from its log lines (every
line names its role and worker index) and the supervisor's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from bench.procfs import proc_mb
from streamer.runtime.topics import create_topics
from tests.harness import Harness
from tests.otlp_factory import ShopTelemetry, to_proto

pytestmark = pytest.mark.engines

UPDATE = "UPDATE orders SET status = %s WHERE id = %s"
PARTITIONS = 4


def _traces(n: int, first: int) -> dict[str, bytes]:
    """``n`` request traces (3 spans each, one UPDATE), one TracesData message per trace, by trace id."""
    shop = ShopTelemetry()
    base = time.time_ns()
    for i in range(first, first + n):
        shop.request(f"/orders/{i % 3}", statements=[(UPDATE, f"('paid', {1000 + i})")], function="capture_payment",
                     start_ns=base + (i - first) * 3_000_000)  # fmt: skip
    by_trace: dict[str, list[Any]] = defaultdict(list)
    for span in shop.take():
        assert span.context is not None
        by_trace[format(span.context.trace_id, "032x")].append(span)
    return {trace: to_proto(spans) for trace, spans in by_trace.items()}


async def _produce(bootstrap: str, topic: str, messages: dict[str, bytes]) -> None:
    """Keyed by trace id, as the OTel Collector's kafka exporter does: the traces spread over the partitions."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, value, key=key.encode()) for key, value in messages.items()])
    finally:
        await producer.stop()


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _spans_owned(log: Path, topic: str) -> dict[int, set[str]]:
    """The spans partitions each ingest worker holds now (its latest assignment)."""
    owned: dict[int, set[str]] = {}
    for e in _events(log):
        if e.get("event") == "partitions.assigned" and e.get("role") == "ingest":
            owned[e["worker"]] = {p for p in e["partitions"] if p.startswith(f"{topic}/")}
    return owned


def _worker_pids(log: Path) -> dict[tuple[str, int], list[int]]:
    pids: dict[tuple[str, int], list[int]] = defaultdict(list)
    for e in _events(log):
        if e.get("event") == "worker.started":
            pids[(e["role"], e["worker"])].append(e["pid"])
    return pids


def _scrape(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return str(resp.read().decode())


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # dead, waiting for a reaper that is not us


def _wait(what: str, ready: Any, daemon: subprocess.Popen[bytes], log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert daemon.poll() is None, f"the daemon exited ({daemon.returncode}) waiting for {what}:\n" + _tail(log)
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + _tail(log)
        time.sleep(0.2)


def _spawn(env: dict[str, str], log: Path, workers: int = 2) -> subprocess.Popen[bytes]:
    """``trace-repro run --workers N`` as an operator runs it: ``env`` over this environment, output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "streamer.cli", "run", "--workers", str(workers)],
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


def test_two_workers_share_the_partitions_survive_a_killed_worker_and_drain(harness: Harness, tmp_path: Path) -> None:
    """Both ingest workers get spans partitions; a worker SIGKILLed mid-stream is restarted and every trace is in
    the graph exactly once; SIGTERM drains every worker and the daemon exits 0, leaving no process behind."""
    s = harness.settings
    k = s.kafka
    asyncio.run(create_topics(k.bootstrap, {k.spans_topic: PARTITIONS, k.logs_topic: 1}))
    env = {
        **os.environ,
        "TRACE_REPRO_KAFKA_BOOTSTRAP": k.bootstrap,
        "TRACE_REPRO_FALKORDB_URL": s.falkordb.url,
        "TRACE_REPRO_ENVIRONMENT": s.environment,
        "TRACE_REPRO_KAFKA__GROUP_ID": k.group_id,
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": k.auto_offset_reset,
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": k.spans_topic,
        "TRACE_REPRO_KAFKA__LOGS_TOPIC": k.logs_topic,
        "TRACE_REPRO_KAFKA__CDC_PATTERN": k.cdc_pattern,
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": k.accesses_topic,
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": k.dlq_topic,
        "TRACE_REPRO_KAFKA__INCIDENTS_TOPIC": k.incidents_topic,
        "TRACE_REPRO_KAFKA__REPROS_TOPIC": k.repros_topic,
        "TRACE_REPRO_KAFKA__VERDICTS_TOPIC": k.verdicts_topic,
        "TRACE_REPRO_KAFKA__CONTRACTS_TOPIC": f"{k.accesses_topic}-contracts",
        "TRACE_REPRO_KAFKA__MAX_POLL_RECORDS": "2",
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.5",
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
        "TRACE_REPRO_WINDOWS__IDLE_S": "0.5",
        "TRACE_REPRO_HTTP__PORT": "0",
    }
    first, second = _traces(300, 0), _traces(100, 300)
    log = tmp_path / "daemon.log"
    cmd = [sys.executable, "-m", "streamer.cli", "run", "--workers", "2"]
    with log.open("ab") as out:
        daemon = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        every = {f"{k.spans_topic}/{p}" for p in range(PARTITIONS)}

        def shared() -> bool:  # both own some, together all, none twice (the first owner logs its revoke later)
            owned = _spans_owned(log, k.spans_topic)
            mine, theirs = owned.get(0, set()), owned.get(1, set())
            return bool(mine and theirs) and mine | theirs == every and not mine & theirs

        _wait("both workers to share the spans partitions", shared, daemon, log)
        port = next(e["http_port"] for e in _events(log) if e.get("event") == "daemon.starting"
                    and e.get("role") == "supervisor")  # fmt: skip
        _wait("/readyz", lambda: _ready(port), daemon, log)

        asyncio.run(_produce(k.bootstrap, k.spans_topic, first))
        worker1 = next(e["http_port"] for e in _events(log) if e.get("event") == "worker.listening"
                       and e["role"] == "ingest" and e["worker"] == 1)  # fmt: skip
        _wait("worker 1 consuming", lambda: _consumed(worker1, k.spans_topic) >= 10, daemon, log)
        victim = _worker_pids(log)[("ingest", 1)][-1]
        os.kill(victim, signal.SIGKILL)
        asyncio.run(_produce(k.bootstrap, k.spans_topic, second))
        _wait("a replacement for worker 1", lambda: len(_worker_pids(log)[("ingest", 1)]) == 2, daemon, log)

        want = len(first) + len(second)
        _wait("every trace", lambda: harness.count("MATCH (t:Trace) RETURN count(t)") >= want, daemon, log, 180)
        _wait("/readyz after the restart", lambda: _ready(port), daemon, log)
        metrics = _scrape(port, "/metrics")
        assert 'trace_repro_worker_restarts_total{role="ingest",worker="1"} 1.0' in metrics
        assert 'trace_repro_worker_restarts_total{role="ingest",worker="0"} 0.0' in metrics
        assert "trace_repro_consumed_messages_total{topic=" in metrics  # the workers' own series, merged
        assert harness.count("MATCH (t:Trace) RETURN count(t)") == want
        assert harness.count("MATCH (t:Trace) RETURN count(DISTINCT t.id)") == want
        assert harness.count("MATCH (s:Span) RETURN count(s)") == harness.count(
            "MATCH (s:Span) RETURN count(DISTINCT s.id)"
        )
        assert harness.count("MATCH (:Span)-[o:OF]->(:Trace) RETURN count(o)") == 3 * want
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(180)
    assert code == 0, _tail(log)
    workers = [pid for pids in _worker_pids(log).values() for pid in pids]
    assert len(workers) == 4  # ingest 0, ingest 1 twice, entities
    assert all(_gone(pid) for pid in workers)
    stopped = [(e["role"], e.get("worker")) for e in _events(log) if e.get("event") == "stage.stopped"]
    assert sorted(stopped, key=str) == sorted([("ingest", 0), ("ingest", 1), ("entities", 0)], key=str)


def _consumed(port: int, topic: str) -> float:
    """Messages of ``topic`` one worker consumed, from its own /metrics."""
    for line in _scrape(port, "/metrics").splitlines():
        if line.startswith(f'trace_repro_consumed_messages_total{{topic="{topic}"}} '):
            return float(line.split()[-1])
    return 0.0


def _ready(port: int) -> bool:
    try:
        return _scrape(port, "/readyz").strip() == "ready"
    except OSError:
        return False


def test_sigkill_of_the_supervisor_leaves_no_worker(harness: Harness, tmp_path: Path) -> None:
    """The supervisor killed with SIGKILL takes its workers with it (PR_SET_PDEATHSIG): no orphan keeps consuming."""
    s = harness.settings
    asyncio.run(harness.create_topics(s.kafka.spans_topic, s.kafka.logs_topic))
    env = {**os.environ, "TRACE_REPRO_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "TRACE_REPRO_FALKORDB_URL": s.falkordb.url,
           "TRACE_REPRO_ENVIRONMENT": s.environment, "TRACE_REPRO_KAFKA__GROUP_ID": s.kafka.group_id,
           "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": s.kafka.auto_offset_reset,
           "TRACE_REPRO_KAFKA__SPANS_TOPIC": s.kafka.spans_topic, "TRACE_REPRO_KAFKA__LOGS_TOPIC": s.kafka.logs_topic,
           "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": s.kafka.accesses_topic, "TRACE_REPRO_HTTP__PORT": "0"}  # fmt: skip
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen([sys.executable, "-m", "streamer.cli", "run", "--workers", "2"], env=env,
                                  stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        _wait("three workers listening",
              lambda: sum(e.get("event") == "worker.listening" for e in _events(log)) == 3, daemon, log)  # fmt: skip
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
    workers = [pid for pids in _worker_pids(log).values() for pid in pids]
    assert len(workers) == 3
    deadline = time.monotonic() + 30
    while not all(_gone(pid) for pid in workers):
        assert time.monotonic() < deadline, f"orphan workers: {[p for p in workers if not _gone(p)]}\n" + _tail(log)
        time.sleep(0.1)


def test_workers_share_the_daemons_imports_with_the_supervisor(harness: Harness, tmp_path: Path) -> None:
    """The workers are forked from the supervisor: the modules it imported to load the configuration are the
    workers' too, in pages they share (a worker started as a new interpreter has every anonymous page to itself)."""
    s = harness.settings
    asyncio.run(harness.create_topics(s.kafka.spans_topic, s.kafka.logs_topic))
    env = {"TRACE_REPRO_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "TRACE_REPRO_FALKORDB_URL": s.falkordb.url,
           "TRACE_REPRO_ENVIRONMENT": s.environment, "TRACE_REPRO_KAFKA__GROUP_ID": s.kafka.group_id,
           "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": s.kafka.auto_offset_reset,
           "TRACE_REPRO_KAFKA__SPANS_TOPIC": s.kafka.spans_topic, "TRACE_REPRO_KAFKA__LOGS_TOPIC": s.kafka.logs_topic,
           "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": s.kafka.accesses_topic, "TRACE_REPRO_HTTP__PORT": "0"}  # fmt: skip
    log = tmp_path / "daemon.log"
    daemon = _spawn(env, log)
    try:
        port = 0

        def ready() -> bool:
            nonlocal port
            port = next((e["http_port"] for e in _events(log) if e.get("event") == "daemon.starting"
                         and e.get("role") == "supervisor"), 0)  # fmt: skip
            return bool(port) and _ready(port)

        _wait("/readyz", ready, daemon, log)
        workers = [pids[-1] for pids in _worker_pids(log).values()]
        assert len(workers) == 3
        for pid in workers:
            anonymous, pss = (proc_mb(pid, key, "smaps_rollup") for key in ("Anonymous", "Pss_Anon"))
            assert anonymous is not None and pss is not None
            shared_mb = anonymous - pss  # anonymous memory shared with k processes counts 1/k in Pss_Anon
            assert shared_mb >= 15, f"worker {pid} shares {shared_mb:.1f} MB of its {anonymous:.1f} MB anonymous"
    finally:
        daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(60)
    assert code == 0, _tail(log)
