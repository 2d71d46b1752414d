"""The supervisor of ``trace-repro run --workers N``: stage 1 as N processes of one consumer group, stage 2 beside.

Python runs one core per process, so stage 1 (decode, trace assembly, graph rows: the hot path) runs as N worker
processes in the same consumer group, sharing nothing but Kafka and FalkorDB; Kafka spreads the partitions over
them as it would over N machines, and the delivery guarantees are those of replicas (pinned offsets, idempotent
writes, low watermarks per owned partition). Stage 2 (``entities``) keeps one instance per daemon, in a worker of its
own that also runs the output-topic sinks and connectors (GitLab, files, the repro worker): an ingest worker that
crashes never restarts stage 2, and stage 2's state never competes with an ingest worker's for one core. With
``--stage ingest`` the first ingest worker runs the sinks.

Workers are forked from this process (:mod:`.fork`), so the daemon's imports are in memory once for all of them.
This process only supervises, and serves the daemon's HTTP address:

- ``/metrics``: every worker's exposition merged (:mod:`.merge`), plus ``trace_repro_worker_up`` and
  ``trace_repro_worker_restarts_total``. Each worker serves its own registry on a private port of 127.0.0.1 and
  reports it on a pipe; the merge is done at scrape time, so it is as fresh as one process's (prometheus_client's
  multiprocess mode would lose the components' telemetry, which is read from memory at scrape time);
- ``/healthz``: 200 while the supervisor runs (a dead worker is its business: restarted, or the daemon exits);
- ``/readyz``: 200 when every worker is running and answers 200 itself; the body names those that do not.

SIGTERM/SIGINT are forwarded and every worker drains (finishes, writes and commits its batch) within ``DRAIN_S``,
or is killed and the daemon exits 1. A worker that dies is restarted after a backoff (1 s, doubling, at most 30 s),
counted; more than ``MAX_RESTARTS`` restarts of one worker in ``RESTART_WINDOW_S``, or a worker refusing the
configuration (exit 2), stops the daemon with that reason and a non-zero status. A SIGKILL of this process leaves
no worker behind: each has the kernel kill it when its parent dies (``PR_SET_PDEATHSIG``) and watches a pipe only
this process holds open (see :mod:`.child`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from streamer.config import CoreSettings
from streamer.runtime.http import HttpServer
from streamer.runtime.workers import child
from streamer.runtime.workers.fork import Forked, fork
from streamer.runtime.workers.merge import merge

log = structlog.get_logger("trace_repro.supervisor")

DRAIN_S = 120.0  # after SIGTERM, how long the workers have to drain before they are killed
MAX_RESTARTS = 5  # restarts of one worker within RESTART_WINDOW_S before the daemon gives up
RESTART_WINDOW_S = 300.0
BACKOFF_FIRST_S = 1.0  # the first restart's delay; doubled for each further restart within the window
BACKOFF_MAX_S = 30.0
SCRAPE_TIMEOUT_S = 5.0
CONFIG_ERROR = 2  # a worker's exit status for a configuration it refuses: restarting cannot help


@dataclass
class Worker:
    """One worker slot: what it runs, the process in it now, and its restart history."""

    role: str
    index: int
    stages: tuple[str, ...]
    sinks: bool
    process: Forked | None = None
    port: int = 0
    restarts: int = 0
    recent: deque[float] = field(default_factory=deque)  # monotonic times of the restarts in the window
    exit_code: int | None = None

    @property
    def name(self) -> str:
        return f"{self.role} {self.index}"


def plan(stages: tuple[str, ...], workers: int) -> list[Worker]:
    """The worker slots: ``workers`` ingest workers, and one for stage 2 and the sinks when it runs here."""
    slots = []
    if "ingest" in stages:
        sinks_here = "entities" not in stages
        slots += [Worker("ingest", i, ("ingest",), sinks_here and i == 0) for i in range(workers)]
    if "entities" in stages:
        slots.append(Worker("entities", 0, ("entities",), True))
    return slots


class Supervisor:
    """Runs the worker slots until SIGTERM/SIGINT or a worker fails for good; see the module docstring."""

    def __init__(self, settings: CoreSettings, config_path: Path | None, workers: list[Worker]) -> None:
        self.settings = settings
        self.config_path = config_path
        self.workers = workers
        self.stopping = asyncio.Event()
        self.failure: tuple[int, str] | None = None
        self.http = HttpServer(settings.http.host, settings.http.port, self._metrics, self._ready)

    # ---- running ----------------------------------------------------------------------------------------------

    async def run(self) -> int:
        await self.http.start()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        log.info("daemon.starting", http_port=self.http.port, pid=os.getpid(),
                 workers=[w.name for w in self.workers])  # fmt: skip
        try:
            tasks = [asyncio.create_task(self._keep(w), name=w.name) for w in self.workers]
            await self.stopping.wait()
            self._signal_all(signal.SIGTERM)
            done, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
            if pending:
                late = [w.name for w in self.workers if w.process is not None]
                self._fail(1, f"workers did not drain within {DRAIN_S:.0f}s: {', '.join(late)}")
                self._signal_all(signal.SIGKILL)
                await asyncio.gather(*pending, return_exceptions=True)
            for task in done:
                task.result()  # a bug in the supervisor itself is not swallowed
        finally:
            self._signal_all(signal.SIGKILL)  # only if still running (an exception above)
            await self.http.stop()
        unclean = [f"{w.name} exited {w.exit_code}" for w in self.workers
                   if w.exit_code not in (None, 0, -signal.SIGTERM)]  # fmt: skip
        if self.failure is None and unclean:
            self.failure = (1, "; ".join(unclean))
        if self.failure is not None:
            log.error("daemon.failed", reason=self.failure[1], exit_code=self.failure[0])
            return self.failure[0]
        log.info("daemon.stopped")
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("daemon.signal", signal=sig.name, action="draining every worker")
        self.stopping.set()
        self._signal_all(signal.SIGTERM)

    def _signal_all(self, sig: signal.Signals) -> None:
        for w in self.workers:
            if w.process is not None and w.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    w.process.send_signal(sig)

    def _fail(self, code: int, reason: str) -> None:
        if self.failure is None:
            self.failure = (code, reason)
        self.stopping.set()

    async def _keep(self, w: Worker) -> None:
        """Run the slot's worker, and restart it when it dies (bounded, with backoff) until the daemon stops."""
        try:
            await self._restarting(w)
        except Exception as exc:  # cannot start a process at all (fds, memory): the daemon stops, saying why
            log.exception("worker.unsupervised", role=w.role, worker=w.index)
            self._fail(1, f"cannot run worker {w.name}: {exc!r}")

    async def _restarting(self, w: Worker) -> None:
        while not self.stopping.is_set():
            code = await self._run_once(w)
            w.exit_code = code
            if self.stopping.is_set():
                return
            if code == CONFIG_ERROR:
                self._fail(CONFIG_ERROR, f"worker {w.name} refused the configuration (exit {code})")
                return
            now = time.monotonic()
            while w.recent and now - w.recent[0] > RESTART_WINDOW_S:
                w.recent.popleft()
            if len(w.recent) >= MAX_RESTARTS:
                self._fail(1, f"worker {w.name} died {len(w.recent) + 1} times within {RESTART_WINDOW_S:.0f}s "
                              f"(last exit {code})")  # fmt: skip
                return
            delay = min(BACKOFF_FIRST_S * 2 ** len(w.recent), BACKOFF_MAX_S)
            w.recent.append(now)
            w.restarts += 1
            log.warning("worker.died", role=w.role, worker=w.index, exit_code=code, restart_in_s=delay,
                        restarts=w.restarts)  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)

    async def _run_once(self, w: Worker) -> int:
        """Start the slot's worker process and wait for it to exit; its exit status."""
        lifeline_r, lifeline_w = os.pipe()  # the worker reads; only this process writes (never): EOF = we are gone
        status_r, status_w = os.pipe()
        argv = ["--role", w.role, "--index", str(w.index), "--stages", ",".join(w.stages), "--parent", str(os.getpid()),
                "--status-fd", str(status_w), "--lifeline-fd", str(lifeline_r)]  # fmt: skip
        if w.sinks:
            argv.append("--sinks")
        if self.config_path is not None:
            argv += ["--config", str(self.config_path)]
        try:
            w.process = fork(child.main, argv, keep=(lifeline_r, status_w))
        finally:
            os.close(lifeline_r)
            os.close(status_w)
        if self.stopping.is_set():
            self._signal_all(signal.SIGTERM)
        log.info("worker.started", role=w.role, worker=w.index, pid=w.process.pid, stages=list(w.stages),
                 sinks=w.sinks, restarts=w.restarts)  # fmt: skip
        status = asyncio.create_task(self._read_status(w, status_r))
        try:
            return await w.process.wait()
        finally:
            status.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await status
            os.close(lifeline_w)
            w.process, w.port = None, 0

    async def _read_status(self, w: Worker, fd: int) -> None:
        """The worker's status line: the port its HTTP endpoints listen on."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(fd, "rb", 0))  # fmt: skip
        try:
            line = await reader.readline()
            if line:
                w.port = int(json.loads(line)["port"])
                log.info("worker.listening", role=w.role, worker=w.index, http_port=w.port)
        finally:
            transport.close()

    # ---- HTTP -------------------------------------------------------------------------------------------------

    async def _metrics(self) -> bytes:
        answers = await asyncio.gather(*(_get(w.port, "/metrics") for w in self.workers))
        up = GaugeMetricFamily("trace_repro_worker_up", "1 while a worker process runs and answers",
                               labels=["role", "worker"])  # fmt: skip
        restarts = CounterMetricFamily("trace_repro_worker_restarts", "Worker processes restarted after dying",
                                       labels=["role", "worker"])  # fmt: skip
        for w, (status, _) in zip(self.workers, answers, strict=True):
            up.add_metric([w.role, str(w.index)], 1 if status == 200 else 0)
            restarts.add_metric([w.role, str(w.index)], w.restarts)
        extra: list[Metric] = [up, restarts]
        return merge((body for status, body in answers if status == 200), extra)

    async def _ready(self) -> tuple[bool, str]:
        if self.stopping.is_set():
            return False, "stopping"
        answers = await asyncio.gather(*(_get(w.port, "/readyz") for w in self.workers))
        failing = [f"{w.name}: {body.strip() or 'starting'}" for w, (status, body) in zip(self.workers, answers,
                   strict=True) if status != 200]  # fmt: skip
        return not failing, "; ".join(failing)


async def _get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of ``GET path`` on a worker's port; (0, why) when it does not answer."""
    if not port:
        return 0, "starting"
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), SCRAPE_TIMEOUT_S)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await asyncio.wait_for(reader.read(), SCRAPE_TIMEOUT_S)
        finally:
            writer.close()
    except (OSError, TimeoutError) as exc:
        return 0, f"not answering ({type(exc).__name__})"
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0, "bad answer"
    return status, body.decode("utf-8", "replace")
