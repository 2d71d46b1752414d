"""Stopping a Kafka consumer while the broker may be away."""

from __future__ import annotations

import asyncio
import contextlib

import structlog
from aiokafka import AIOKafkaConsumer

log = structlog.get_logger("trace_repro.runtime")
STOP_TIMEOUT_S = 5.0


async def stop_consumer(consumer: AIOKafkaConsumer, name: str) -> None:
    """``consumer.stop()`` (which leaves the group), bounded: with the broker away, aiokafka waits for the group's
    coordinator forever, and a fetch that was backing off from a broker error lets its cancellation out of
    ``stop()``. Either way the stop is given up (the group forgets this member when its session expires) and the
    consumer's fetches and connections are closed all the same. Only a cancellation of the caller itself is raised.
    """
    try:
        await asyncio.wait_for(consumer.stop(), STOP_TIMEOUT_S)
        return
    except TimeoutError:
        log.warning("consumer.stop_timeout", consumer=name, seconds=STOP_TIMEOUT_S)
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
        log.warning("consumer.stop_interrupted", consumer=name)
    for task in list(getattr(consumer._fetcher, "_pending_tasks", ())):  # what stop() had not reached yet
        task.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(consumer._client.close(), STOP_TIMEOUT_S)
