"""The daemon with a stage that fails, as a process: ``python -m tests.runtime.failing_daemon`` (the stage-failure
tests run it; a subprocess, because what is checked is how the process ends).

Set by the environment, besides the ``TRACE_REPRO_*`` settings:

- ``FAIL_STAGE`` (``ingest`` | ``entities``): that stage's runner raises ``RuntimeError`` after ``FAIL_AFTER``
  batches (default 3);
- ``FAIL_ONCE``: a path; only the process that creates it fails (a worker restarted by the supervisor runs clean);
- ``STUCK_STOP=1``: once the stage has failed, every Kafka consumer's ``stop`` in that process ignores cancellation
  and never returns (a client stuck on the broker, as a LeaveGroup request waiting out its timeout was);
- ``STOP_GRACE_S``, ``CANCEL_GRACE_S``: the daemon's bounded shutdown, shortened;
- ``WORKERS``: run that many ingest workers under the supervisor instead of one process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from aiokafka import AIOKafkaConsumer

from streamer import daemon
from streamer.runtime import app
from streamer.runtime.runner import StageRunner


def _first(path: str) -> bool:
    """True in the one process that creates ``path`` (always True without a path)."""
    if not path:
        return True
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


failed = False  # in this process


def _fail(stage: str, after: int, once: str) -> None:
    handle = StageRunner._handle

    async def failing(self: StageRunner, batch: Any) -> None:
        global failed
        if self.name == stage and self.batches >= after and _first(once):
            failed = True
            raise RuntimeError(f"injected failure in stage {stage}")
        await handle(self, batch)

    StageRunner._handle = failing  # type: ignore[method-assign]


def _stick() -> None:
    stop = AIOKafkaConsumer.stop

    async def stuck(self: AIOKafkaConsumer) -> None:
        if not failed:
            await stop(self)
            return
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    AIOKafkaConsumer.stop = stuck  # type: ignore[method-assign]


def main() -> int:
    env = os.environ
    if env.get("FAIL_STAGE"):
        _fail(env["FAIL_STAGE"], int(env.get("FAIL_AFTER", "3")), env.get("FAIL_ONCE", ""))
    if env.get("STUCK_STOP") == "1":
        _stick()
    for grace in ("STOP_GRACE_S", "CANCEL_GRACE_S"):
        if grace in env:
            setattr(app, grace, float(env[grace]))
    return daemon.run(None, workers=int(env.get("WORKERS", "1")))


if __name__ == "__main__":
    sys.exit(main())
