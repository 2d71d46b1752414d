"""The sample shop's spans as the daemon reads them: a topic's messages from the start, until they hold the requests
a scenario sent (the live detector tests share this)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer

from processors.model.events import SpanKind
from processors.model.span import Span
from streamer.decode import decode_traces_proto


def is_server(span: Span) -> bool:
    return span.kind is SpanKind.SERVER


def is_request(span: Span) -> bool:
    """A server span or a root (the shop's jobs have no server span)."""
    return span.kind is SpanKind.SERVER or not span.parent_id


async def messages(bootstrap: str, topic: str, requests: int, *, counts: Callable[[Span], bool] = is_server,
                   timeout_s: float = 60) -> tuple[list[bytes], int]:  # fmt: skip
    """The topic's messages from the start until they hold ``requests`` spans that ``counts`` (or the deadline),
    and how many they hold."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"shop-spans-{uuid.uuid4().hex[:8]}", enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    values: list[bytes] = []
    seen = 0
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and seen < requests:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for r in records:
                    values.append(r.value)
                    seen += sum(counts(s) for s in decode_traces_proto(r.value))
    finally:
        await consumer.stop()
    return values, seen
