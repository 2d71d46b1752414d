"""The Kafka sink: every message the daemon produces (output events, dead letters, the internal topic).

One idempotent producer (``enable_idempotence``, ``acks=all``) per daemon, so a retried send is never written twice.
Output events are keyed by fingerprint, so all of one defect's events stay in order on one partition, and go to
the topic of their role (``Published.topic``: incidents, repros, verdicts, contracts). ``send`` queues a batch and
returns once every message is acknowledged: the runtime commits offsets only after that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from processors.model.base import Published
from processors.sink import Sink
from processors.telemetry import Telemetry
from sinks.kafka.config import KafkaConfig


@dataclass(frozen=True, slots=True)
class Message:
    """One message to produce."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None  # None: by key (or the producer's choice when there is no key)


class KafkaSink(Sink):
    """See the module docstring; ``write`` publishes at once and ``flush`` has nothing left to do."""

    name = "kafka"

    def __init__(self, config: KafkaConfig, *, telemetry: Telemetry | None = None, linger_ms: int = 5,
                 max_request_size: int = 16 * 1024 * 1024) -> None:  # fmt: skip
        self.config = config
        self.telemetry = telemetry or Telemetry("kafka")
        self._producer = AIOKafkaProducer(bootstrap_servers=config.bootstrap, enable_idempotence=True, acks="all",
                                          linger_ms=linger_ms, max_request_size=max_request_size)  # fmt: skip
        self._started = False

    async def start(self) -> None:
        await self._producer.start()
        self._started = True

    async def close(self) -> None:
        if self._started:
            await self._producer.stop()
            self._started = False

    async def send(self, messages: Iterable[Message]) -> None:
        """Produce every message and wait until all are acknowledged."""
        futures = []
        for m in messages:
            futures.append(await self._producer.send(m.topic, m.value, key=m.key, partition=m.partition,
                                                     headers=list(m.headers) or None))  # fmt: skip
            self.telemetry.count(m.topic)
        if futures:
            await asyncio.gather(*futures)

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (from the broker's metadata)."""
        return len(await self._producer.partitions_for(topic))

    def message(self, event: Published) -> Message:
        """``event`` as a message on the topic of its role, keyed by its fingerprint."""
        key = str(getattr(event, "fingerprint", "")).encode()
        return Message(self.config.topic(event.topic), key, event.model_dump_json().encode())

    async def publish(self, event: Published) -> None:
        """One event, acknowledged before this returns (``processors.component.Publish``)."""
        await self.send([self.message(event)])

    async def write(self, event: Published) -> None:
        await self.publish(event)

    async def flush(self) -> None:
        """Every write is acknowledged when it returns."""

    async def healthcheck(self) -> bool:
        return self._started
