"""One worker process of ``trace-repro run --workers N``: a :class:`~streamer.runtime.app.Daemon` for one role.

Forked by the supervisor (:mod:`.fork`: the daemon's imports stay shared with it), which calls :func:`main` with the
daemon's own ``--config``; ``python -m streamer.runtime.workers.child`` runs the same in a new interpreter. A worker

- dies with its supervisor: ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` on Linux (the kernel kills it when the supervisor
  is gone, even by SIGKILL), and everywhere a lifeline pipe whose end only the supervisor holds: end of file on it
  means the supervisor is gone, and the worker drains and stops;
- serves ``/metrics``, ``/healthz`` and ``/readyz`` on a free port of 127.0.0.1, which it writes to its status pipe
  as one JSON line (``{"port": N}``); the supervisor serves the daemon's port from those;
- logs with ``role`` and ``worker`` (its index within the role) on every line;
- stops on SIGTERM/SIGINT like the single-process daemon: the batch in hand is finished, written and committed.

Exit status: 0 stopped, 1 failed (Kafka unreachable, a crash, a stage or a sink runner that failed: the worker
then exits within the daemon's bounded shutdown, see :mod:`streamer.runtime.app`, and the supervisor restarts it
with its backoff), 2 bad configuration (the supervisor does not restart a worker whose configuration is wrong).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from aiokafka.errors import KafkaError

from processors.api.component import Factory
from processors.model.outputs import register
from streamer import config, logs
from streamer.components import Components, default
from streamer.config import CoreSettings, HttpConfig
from streamer.runtime.app import Daemon, run_daemon

log = structlog.get_logger("trace_repro.worker")
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above
        os._exit(1)


def output_consumer(factory: Factory[Any, Any]) -> bool:
    """A sink or sink-shaped connector: consumes output topics as a group of its own, outside the stages."""
    return not factory.stage and bool(factory.topics) and factory.kind in ("sink", "connector")


def components(with_sinks: bool) -> Components:
    """The default components; without the output-topic consumers unless this worker runs them."""
    every = default()
    for factory in every.factories:
        register(*factory.events)  # every event kind is known, whichever components this worker builds
    if with_sinks:
        return every
    return Components(every.decoders, tuple(f for f in every.factories if not output_consumer(f)))


async def _serve(settings: CoreSettings, stages: tuple[str, ...], built: Components, status_fd: int,
                 lifeline_fd: int) -> int:  # fmt: skip
    daemon = Daemon(settings, stages=stages, components=built)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop.set)

    def parent_gone() -> None:
        log.warning("worker.orphaned", reason="the supervisor is gone: draining and stopping")
        loop.remove_reader(lifeline_fd)
        daemon.stop.set()

    loop.add_reader(lifeline_fd, parent_gone)  # nothing is ever written: readable = end of file
    task = asyncio.create_task(daemon.run())
    while daemon.http.port == 0 and not task.done():  # noqa: ASYNC110 - the server binds inside run()
        await asyncio.sleep(0.01)
    if not task.done():
        with os.fdopen(status_fd, "w") as status:
            status.write(json.dumps({"port": daemon.http.port, "pid": os.getpid()}) + "\n")
    try:
        return await task
    except KafkaError as exc:
        log.error("daemon.kafka_error", error=str(exc))
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamer.runtime.workers.child")
    p.add_argument("--role", choices=["ingest", "entities"], required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--stages", required=True, help="comma-separated stages this worker runs")
    p.add_argument("--sinks", action="store_true", help="also run the output-topic sinks and connectors")
    p.add_argument("--config", type=Path)
    p.add_argument("--parent", type=int, required=True, help="the supervisor's PID")
    p.add_argument("--status-fd", type=int, required=True)
    p.add_argument("--lifeline-fd", type=int, required=True)
    args = p.parse_args(argv)
    die_with_parent(args.parent)
    logs.configure()
    structlog.contextvars.bind_contextvars(role=args.role, worker=args.index)
    for handler in logging.getLogger().handlers:  # library lines (aiokafka) name the worker too
        handler.setFormatter(logging.Formatter(f"%(levelname)s %(name)s [{args.role} {args.index}] %(message)s"))
    try:
        settings = config.load(args.config)
    except config.ConfigError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level)
    private = HttpConfig(host="127.0.0.1", port=0)  # the supervisor serves the daemon's address
    settings = settings.model_copy(update={"http": private, "workers": 1})
    stages = tuple(args.stages.split(","))
    return run_daemon(_serve(settings, stages, components(args.sinks), args.status_fd, args.lifeline_fd))


if __name__ == "__main__":
    sys.exit(main())
