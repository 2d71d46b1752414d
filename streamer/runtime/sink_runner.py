"""Feed output events from Kafka to a sink (GitLab, files), as a consumer group of its own.

Each sink consumes the output topics from its own committed offsets, so a slow or unreachable sink (GitLab down)
never holds the detectors back and loses nothing: ``add`` every event of a batch, ``flush``, and only then commit.
A sink that raises a retryable error leaves the offsets where they are; the batch is retried after a backoff.
Sinks must be idempotent per event (the GitLab sink marks notes with event ids; the file sink remembers ids).
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Protocol

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from sinks.errors import PermanentSinkError, RetryableSinkError
from streamer.config import Settings
from streamer.runtime.metrics import Metrics
from streamer.schemas import IncidentEvent, OutputEvent, ReproEvent, VerdictEvent

log = structlog.get_logger("trace_repro.sinks")

EVENT_TYPES: dict[str, type[OutputEvent]] = {"incident": IncidentEvent, "repro": ReproEvent, "verdict": VerdictEvent}


class Sink(Protocol):
    async def add(self, event: OutputEvent) -> None: ...
    async def flush(self) -> None: ...
    async def healthcheck(self) -> bool: ...
    async def close(self) -> None: ...


def parse_event(value: bytes | None) -> OutputEvent | None:
    """An output event from its JSON, or None for kinds this runner does not know (newer producers)."""
    if not value:
        return None
    raw = json.loads(value)
    model = EVENT_TYPES.get(raw.get("kind", "")) if isinstance(raw, dict) else None
    return model.model_validate(raw) if model else None


class SinkRunner:
    def __init__(self, name: str, sink: Sink, *, settings: Settings, topics: list[str], metrics: Metrics) -> None:
        self.name = name
        self.sink = sink
        self.settings = settings
        self.topics = topics
        self.metrics = metrics
        self.delivered = 0

    async def run(self, stop: asyncio.Event) -> None:
        k = self.settings.kafka
        consumer = AIOKafkaConsumer(
            *self.topics,
            bootstrap_servers=k.bootstrap,
            group_id=f"{k.group_id}.sink.{self.name}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        backoff = 0.5
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=k.poll_timeout_ms, max_records=200)
                if not batch:
                    continue
                try:
                    await self._deliver(batch)
                except RetryableSinkError as exc:
                    self.metrics.dropped.labels(f"sink_{self.name}", "retry").inc()
                    log.warning("sink.retry", sink=self.name, error=str(exc)[:300], backoff_s=round(backoff, 2))
                    for tp, messages in batch.items():  # read the batch again after the backoff
                        consumer.seek(tp, messages[0].offset)
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = 0.5
                offsets = {tp: messages[-1].offset + 1 for tp, messages in batch.items()}
                try:
                    await consumer.commit(offsets)
                except KafkaError as exc:  # replayed later; the sink is idempotent per event
                    log.warning("sink.commit_failed", sink=self.name, error=str(exc)[:200])
        finally:
            await consumer.stop()
            await self.sink.close()

    async def _deliver(self, batch: dict[TopicPartition, list[object]]) -> None:
        for messages in batch.values():
            for m in messages:
                try:
                    event = parse_event(m.value)  # type: ignore[attr-defined]
                except (ValueError, ValidationError) as exc:
                    self.metrics.dropped.labels(f"sink_{self.name}", "invalid_event").inc()
                    log.error("sink.invalid_event", sink=self.name, error=str(exc)[:300])
                    continue
                if event is not None:
                    await self.sink.add(event)
                    self.delivered += 1
        while True:
            try:
                await self.sink.flush()
                return
            except PermanentSinkError as exc:  # that event is dropped by the sink; deliver the rest
                self.metrics.dropped.labels(f"sink_{self.name}", "rejected").inc()
                log.error("sink.rejected", sink=self.name, error=str(exc)[:300])
