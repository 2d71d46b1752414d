"""Reading a bounded sample of the configured topics: the spans and logs topics and every topic ``kafka.cdc_pattern``
matches, at most ``messages`` messages per topic (spread over its partitions), for at most ``seconds``, from the end
(the latest messages) or from the beginning.

No consumer group: partitions are assigned, so the sample commits nothing and disturbs no group. The clients are
built like the daemon's (:func:`sinks.kafka.client.client_kwargs`), so a secured cluster is read as the daemon reads it.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig
from streamer.decode import Record
from streamer.runtime.consumers import stop_consumer

CONNECT_TIMEOUT_S = 15.0


class SampleError(RuntimeError):
    """Nothing could be read: no broker, or none of the configured topics."""


@dataclass(slots=True)
class Sample:
    """The records read, and what could not be (a configured topic that does not exist)."""

    records: list[Record] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def wanted_topics(kafka: KafkaConfig, existing: set[str]) -> tuple[list[str], list[str]]:
    """The configured topics that exist (spans, logs, then the CDC topics), and notes on those that do not."""
    out, notes = [], []
    for what, topic in (("spans", kafka.spans_topic), ("logs", kafka.logs_topic)):
        if topic in existing:
            out.append(topic)
        else:
            notes.append(f"no {what} topic {topic!r} (kafka.{what}_topic)")
    pattern = re.compile(kafka.cdc_pattern)
    cdc = sorted(t for t in existing if pattern.search(t) and t not in out)
    if not cdc:
        notes.append(f"no topic matches kafka.cdc_pattern {kafka.cdc_pattern!r}")
    return out + cdc, notes


async def read_sample(kafka: KafkaConfig, *, messages: int, seconds: float, from_beginning: bool) -> Sample:
    """Read the sample, or raise :class:`SampleError` when there is no broker or no topic to read."""
    consumer = AIOKafkaConsumer(**client_kwargs(kafka, "doctor"), group_id=None, enable_auto_commit=False,
                                max_partition_fetch_bytes=kafka.max_partition_fetch_bytes)  # fmt: skip
    try:
        await asyncio.wait_for(consumer.start(), CONNECT_TIMEOUT_S)
    except (KafkaError, OSError, TimeoutError) as exc:
        await stop_consumer(consumer, "doctor")
        raise SampleError(f"cannot reach the Kafka brokers at {kafka.bootstrap}: {exc or type(exc).__name__}") from exc
    try:
        cluster = await consumer._client.fetch_all_metadata()  # (what consumer.topics() reads, partitions with it)
        topics, notes = wanted_topics(kafka, cluster.topics())
        if not topics:
            raise SampleError("none of the configured topics exists: " + "; ".join(notes))
        sample = Sample(topics=topics, notes=notes)
        parts = [TopicPartition(t, p) for t in topics for p in sorted(cluster.partitions_for_topic(t) or ())]
        await _read(consumer, sample, parts, messages, seconds, from_beginning)
        return sample
    finally:
        await stop_consumer(consumer, "doctor")


async def _read(consumer: AIOKafkaConsumer, sample: Sample, parts: list[TopicPartition], messages: int,
                seconds: float, beginning: bool) -> None:  # fmt: skip
    consumer.assign(parts)
    first, end = await consumer.beginning_offsets(parts), await consumer.end_offsets(parts)
    per_topic: dict[str, int] = {}
    for tp in parts:
        per_topic[tp.topic] = per_topic.get(tp.topic, 0) + 1
    stop: dict[TopicPartition, int] = {}
    for tp in parts:
        quota = math.ceil(messages / per_topic[tp.topic])
        start = first[tp] if beginning else max(first[tp], end[tp] - quota)
        stop[tp] = min(end[tp], start + quota)
        if start < stop[tp]:
            consumer.seek(tp, start)
    open_parts = {tp for tp in parts if first[tp] < stop[tp]}
    consumer.pause(*(set(parts) - open_parts))
    deadline = time.monotonic() + seconds
    while open_parts and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for tp, msgs in batch.items():
            for m in msgs:
                if m.offset < stop[tp]:
                    sample.records.append(Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp,
                                                 tuple(m.headers or ())))  # fmt: skip
            if msgs and msgs[-1].offset + 1 >= stop[tp]:
                open_parts.discard(tp)
                consumer.pause(tp)
    if open_parts:
        sample.notes.append(f"stopped after {seconds:g} s with {len(open_parts)} partition(s) not read to the end")
