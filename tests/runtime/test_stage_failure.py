"""A stage never dies quietly: a stage or sink runner that ends while the daemon runs is logged at once with its
traceback, fails ``/healthz`` and ``/readyz``, and ends the daemon with status 1 within a bounded time.

Before, an exception that escaped a stage ended its task with an ordinary ``stage.stopped`` line; the daemon then
stopped its HTTP server and waited, with no bound, for the other tasks (``asyncio.run`` cancels them and waits for
their clean-up: a consumer leaving its group waits out the broker's request timeout, and aiokafka retries it), and
the traceback was printed only when the process finally ended: a process up for minutes with a dead stage, and
nothing in the log to say so.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
from aiokafka import TopicPartition

import streamer.runtime.app
import streamer.runtime.runner
from streamer import config
from streamer.runtime.http import HttpServer
from streamer.runtime.metrics import Metrics
from streamer.runtime.runner import StageRunner, _Rebalance
from tests.harness import Harness, harness_env, harness_settings

pytestmark = pytest.mark.engines

EXIT_DEADLINE_S = 30.0  # the daemon's bounded shutdown (STOP_GRACE_S + CANCEL_GRACE_S) fits well within it


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = (await reader.read()).decode()
    writer.close()
    head, _, body = raw.partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


async def _until(what: str, ready: Callable[[], Any], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Injected(RuntimeError):
    """What the tests make a stage runner raise."""


@pytest.mark.parametrize(("task", "kill"), [("ingest", "raise"), ("entities", "raise"), ("ingest", "cancel"),
                                            ("sink-file_sink", "cancel")])  # fmt: skip
async def test_a_dead_stage_or_sink_runner_is_logged_fails_the_probes_and_ends_the_daemon(
    task: str, kill: str, kafka_bootstrap: str, falkordb_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kill one task of a running daemon (its runner raises, or the task is cancelled from outside): the failure is
    logged with its traceback before the runner's clean-up, ``/healthz`` and ``/readyz`` answer 503 saying what
    failed while the daemon winds down, and ``Daemon.run`` returns 1 within the deadline. (Before: an ordinary
    ``stage.stopped`` line, /healthz 200, and the exception out of ``Daemon.run`` once every other task ended.)"""
    buf = io.StringIO()
    renderers = [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    logger = structlog.wrap_logger(structlog.PrintLogger(buf), processors=renderers)
    monkeypatch.setattr(streamer.runtime.app, "log", logger)
    monkeypatch.setattr(streamer.runtime.runner, "log", logger)
    gate = asyncio.Event()  # the HTTP server closes (last thing before the daemon returns) once the test probed it
    close = HttpServer.stop

    async def gated(self: HttpServer) -> None:
        await gate.wait()
        await close(self)

    monkeypatch.setattr(HttpServer, "stop", gated)
    settings = harness_settings(kafka_bootstrap, falkordb_url, FILE_SINK__ENABLED="true",
                                FILE_SINK__DIRECTORY=str(tmp_path))  # fmt: skip
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    try:
        await h.start()
        assert h.daemon is not None and h.task is not None
        daemon, port = h.daemon, h.daemon.http.port
        if kill == "raise":
            runner = next(r for r in daemon.runners if r.name == task)

            async def boom(batch: Any) -> None:
                raise Injected(f"injected failure in stage {task}")

            monkeypatch.setattr(runner, "_handle", boom)
        else:
            next(t for t in asyncio.all_tasks() if t.get_name() == task).cancel()
        what = f"{'sink file_sink' if task.startswith('sink-') else f'stage {task}'}"
        why = "Injected" if kill == "raise" else "cancelled"
        await _until("the failure logged", lambda: f'"task": "{what}"' in buf.getvalue(), timeout_s=20)
        assert await _get(port, "/healthz") == (503, f"failed: {what}: {why}\n")
        assert await _get(port, "/readyz") == (503, f"failed: {what}: {why}\n")
        gate.set()
        assert await asyncio.wait_for(h.task, EXIT_DEADLINE_S) == 1
    finally:
        gate.set()
        await h.stop()
    events = [json.loads(line) for line in buf.getvalue().splitlines()]
    failed = [e for e in events if e["event"].endswith(".failed") and e.get("task") == what]
    assert len(failed) == 1 and failed[0]["error"] == why
    assert ("Injected: injected failure" if kill == "raise" else "CancelledError") in failed[0]["exception"]
    if task in ("ingest", "entities"):  # said before the clean-up (which may wait on the engines), not after it
        stopped = next(i for i, e in enumerate(events) if e["event"] == "stage.stopped" and e["stage"] == task)
        assert events.index(failed[0]) < stopped
    assert events[-1]["event"] == "daemon.failed" and events[-1]["exit_code"] == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(port: int, path: str) -> int:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            return int(s.recv(64).split(b" ", 2)[1])
    except OSError:
        return 0


def test_the_process_exits_non_zero_in_bounded_time_even_with_a_client_stuck_on_the_broker(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """The daemon as a process, its ingest stage failing after a few batches, and every Kafka consumer's ``stop``
    stuck for good (ignoring cancellation). The traceback is on stderr at once, ``/healthz`` and ``/readyz`` answer
    503 while the other tasks get their grace period, and the process exits 1 within the deadline, leaving the stuck
    tasks behind. (Before: the process waited on them forever, its HTTP server already closed.)"""
    port = _free_port()
    env = {**os.environ, **harness_env(kafka_bootstrap, falkordb_url), "TRACE_REPRO_HTTP__PORT": str(port),
           "FAIL_STAGE": "ingest", "STUCK_STOP": "1", "STOP_GRACE_S": "3", "CANCEL_GRACE_S": "1"}  # fmt: skip
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.runtime.failing_daemon"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        probes: set[tuple[int, int]] = set()
        failed_at = None
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the daemon did not exit:\n" + log.read_text()[-3000:]
            if failed_at is None and '"stage.failed"' in log.read_text(errors="replace"):
                failed_at = time.monotonic()
            if failed_at is not None:
                probes.add((_status(port, "/healthz"), _status(port, "/readyz")))
            time.sleep(0.1)
        assert failed_at is not None, log.read_text()[-3000:]
        assert time.monotonic() - failed_at < EXIT_DEADLINE_S
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1
    assert (503, 503) in probes  # while the others had their grace period
    events = [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
    [failed] = [e for e in events if e["event"] == "stage.failed"]
    assert "RuntimeError: injected failure in stage ingest" in failed["exception"]
    assert any(e["event"] == "daemon.abandoned" for e in events)
    assert events[-1]["event"] in ("daemon.failed", "daemon.abandoned")


def _events(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_with_workers_a_worker_whose_stage_died_exits_non_zero_and_is_restarted(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """``--workers 2``: stage 2's worker fails once, its Kafka clients then stuck in their clean-up. The worker logs
    the traceback, exits 1 within its bounded shutdown, the supervisor restarts it after its backoff (counted in
    ``trace_repro_worker_restarts_total``), and the daemon runs on. (Before: the worker waited on its clean-up for
    good, so the supervisor, seeing it alive, never restarted it: stage 2 dead in a daemon that stayed up.)"""
    port = _free_port()
    env = {**os.environ, **harness_env(kafka_bootstrap, falkordb_url), "TRACE_REPRO_HTTP__PORT": str(port),
           "WORKERS": "2", "FAIL_STAGE": "entities", "FAIL_ONCE": str(tmp_path / "failed"), "STUCK_STOP": "1",
           "STOP_GRACE_S": "3", "CANCEL_GRACE_S": "1"}  # fmt: skip
    log = tmp_path / "daemon.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.runtime.failing_daemon"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip

    def first(event: str, **fields: Any) -> dict[str, Any] | None:
        return next((e for e in _events(log) if e.get("event") == event and fields.items() <= e.items()), None)

    def wait(what: str, found: Callable[[], Any], timeout_s: float = 90) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (value := found()):
            assert proc.poll() is None, f"the daemon exited ({proc.returncode}) waiting for {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n" + log.read_text()[-3000:]
            time.sleep(0.2)
        return value

    try:
        failed = wait("the stage failure", lambda: first("stage.failed", role="entities"))
        assert "RuntimeError: injected failure in stage entities" in failed["exception"]
        died_at = time.monotonic()
        died = wait("the worker to exit", lambda: first("worker.died", role="entities"), EXIT_DEADLINE_S)
        assert time.monotonic() - died_at < EXIT_DEADLINE_S and died["exit_code"] == 1
        wait("the restarted worker", lambda: first("worker.started", role="entities", restarts=1))
        # (its stage joins the group once the dead worker's membership, never left, times out: not waited for here)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            metrics = b""
            while chunk := s.recv(65536):
                metrics += chunk
        assert b'trace_repro_worker_restarts_total{role="entities",worker="0"} 1.0' in metrics
        assert proc.poll() is None  # the daemon runs on
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()


async def test_a_rebalance_callback_that_raises_ends_the_stage_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiokafka logs and swallows what a rebalance listener raises; a hand-over that failed half-way (the batch in
    flight not durable, a partition half forgotten) must not leave the stage running on: the runner reports it at
    once and its loop ends on it. (Before: the exception went to aiokafka, which logged it and carried on.)"""
    failures: list[tuple[str, BaseException]] = []
    settings = config.load(None, env={})
    runner = StageRunner("entities", cast(Any, None), settings=settings, group_id="g", graph=cast(Any, None),
                         producer=cast(Any, None), metrics=Metrics())  # fmt: skip
    runner.on_failure = lambda name, exc: failures.append((name, exc))
    error = Injected("half a hand-over")

    async def revoke(revoked: Any) -> None:
        raise error

    monkeypatch.setattr(runner, "revoke", revoke)
    await _Rebalance(runner).on_partitions_revoked([TopicPartition("accesses", 0)])
    assert failures == [("entities", error)] and runner._broken is error
