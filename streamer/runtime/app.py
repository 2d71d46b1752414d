"""Run the daemon until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import signal

import structlog

from streamer import logs
from streamer.config import Settings

log = structlog.get_logger("trace_repro")


async def _main(settings: Settings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("daemon.started", kafka=settings.kafka.bootstrap, falkordb=settings.falkordb.url)
    await stop.wait()
    log.info("daemon.stopped")
    return 0


def serve(settings: Settings) -> int:
    logs.configure()
    return asyncio.run(_main(settings))
