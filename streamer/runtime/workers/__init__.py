"""``trace-repro run --workers N``: stage 1 as N worker processes under one supervisor (see :mod:`.supervisor`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import structlog

from streamer import logs
from streamer.config import CoreSettings
from streamer.runtime.workers.supervisor import Supervisor, plan


def worker_count(requested: int | str | None, settings: CoreSettings) -> int:
    """The ingest workers to run: ``--workers`` if given, else the ``workers`` setting; "auto" = usable cores."""
    value = settings.workers if requested is None else requested
    if value != "auto":
        return max(1, int(value))
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))  # the cores this process may run on (a container's share)
    return os.cpu_count() or 1


def supervise(settings: CoreSettings, config_path: Path | None, stages: tuple[str, ...], workers: int) -> int:
    """Run ``workers`` ingest worker processes (and stage 2 in one more) until SIGTERM/SIGINT; the exit status."""
    logs.configure(settings.log_level)
    structlog.contextvars.bind_contextvars(role="supervisor")
    return asyncio.run(Supervisor(settings, config_path, plan(stages, workers)).run())


__all__ = ["Supervisor", "plan", "supervise", "worker_count"]
