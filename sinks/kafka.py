"""The Kafka sink: every message the daemon produces (output events, dead letters, the internal topic).

One idempotent producer (``enable_idempotence``, ``acks=all``) per daemon, so a retried send is never written twice.
Output events are keyed by incident fingerprint, so all of one defect's events stay in order on one partition.
``send`` queues a batch and returns once every message is acknowledged: the runner commits offsets only after that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from streamer.runtime.metrics import Metrics
from streamer.runtime.records import Outbound


class KafkaSink:
    def __init__(self, bootstrap: str, metrics: Metrics, *, linger_ms: int = 5,
                 max_request_size: int = 16 * 1024 * 1024) -> None:  # fmt: skip
        self.metrics = metrics
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all",
                                          linger_ms=linger_ms, max_request_size=max_request_size)  # fmt: skip

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, messages: Iterable[Outbound]) -> None:
        """Produce every message and wait until all are acknowledged."""
        futures = []
        for m in messages:
            futures.append(await self._producer.send(m.topic, m.value, key=m.key, headers=list(m.headers) or None))
            self.metrics.published.labels(m.topic).inc()
        if futures:
            await asyncio.gather(*futures)

    async def publish(self, topic: str, key: bytes, value: bytes) -> None:
        """One event, acknowledged before this returns."""
        await self.send([Outbound(topic, key, value)])
