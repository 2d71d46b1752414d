"""The Kafka sink on real Kafka: keyed messages where the producer's own partitioner puts them, in order, with
their headers; a message larger than a record batch, an unkeyed one and an explicit partition delivered too."""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from sinks.kafka import KafkaSink, Message
from sinks.kafka.config import KafkaConfig
from sinks.kafka.producer import BATCH_BYTES

pytestmark = pytest.mark.engines

PARTITIONS = 3
Seen = tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]  # partition, key, value, headers


async def _topic(bootstrap: str) -> str:
    topic = f"sink-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    finally:
        await admin.close()
    return topic


async def _read(bootstrap: str, topic: str, expect: int) -> list[Seen]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)  # fmt: skip
    await consumer.start()
    seen: list[Seen] = []
    try:
        for _ in range(100):
            polled = await consumer.getmany(timeout_ms=200)
            for tp, messages in sorted(polled.items(), key=lambda kv: kv[0].partition):
                seen += [(tp.partition, m.key, m.value, tuple(m.headers)) for m in messages]
            if len(seen) >= expect:
                break
    finally:
        await consumer.stop()
    return seen


async def test_keyed_messages_go_where_the_producer_would_put_them_in_order(kafka_bootstrap: str) -> None:
    topic, reference = await _topic(kafka_bootstrap), await _topic(kafka_bootstrap)
    keys = [f"orders:{i % 40}".encode() for i in range(600)]
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap))
    await sink.start()
    plain = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await plain.start()
    try:
        await sink.send([Message(topic, k, b"%d" % i, (("h", b"%d" % i),)) for i, k in enumerate(keys)])
        assert sink.telemetry.events == {topic: len(keys)}  # counted per topic, once per message
        expected = {k: (await (await plain.send(reference, b"", key=k))).partition for k in set(keys)}
    finally:
        await plain.stop()
        await sink.close()
    seen = await _read(kafka_bootstrap, topic, len(keys))
    assert len(seen) == len(keys)
    assert {key: partition for partition, key, _, _ in seen} == expected
    assert len({partition for partition, *_ in seen}) == PARTITIONS
    per_key: dict[bytes | None, list[int]] = defaultdict(list)
    for _, key, value, headers in seen:
        assert value is not None
        assert headers == (("h", value),)
        per_key[key].append(int(value))
    assert all(values == sorted(values) for values in per_key.values())
    assert sorted(v for values in per_key.values() for v in values) == list(range(len(keys)))


async def test_a_large_an_unkeyed_and_a_placed_message_are_delivered(kafka_bootstrap: str) -> None:
    """A value larger than the producer's record batch (``BATCH_BYTES``) is sent in a batch of its own, between the
    batches of its neighbours on the same partition, in order."""
    topic = await _topic(kafka_bootstrap)
    large = b"L" * (BATCH_BYTES + 100_000)
    messages = [Message(topic, b"k", b"before"), Message(topic, b"k", large), Message(topic, b"k", b"after"),
                Message(topic, None, b"anywhere"), Message(topic, None, b"placed", partition=2)]  # fmt: skip
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap))
    await sink.start()
    try:
        await sink.send(messages)
    finally:
        await sink.close()
    seen = await _read(kafka_bootstrap, topic, len(messages))
    assert [v for _, k, v, _ in seen if k == b"k"] == [b"before", large, b"after"]
    assert [v for _, k, v, _ in seen if k is None and v == b"anywhere"] == [b"anywhere"]
    assert [p for p, _, v, _ in seen if v == b"placed"] == [2]
