"""The Kafka sink against topics with a small ``max.message.bytes`` (real Kafka): a dead letter too large is trimmed
to the topic's limit with its original size and digest in headers, any other message too large is dead-lettered and
counted, a limit lowered after the sink read it is learned from the broker's refusal, and the producer goes on."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from sinks.kafka import KafkaSink, Message
from sinks.kafka.config import KafkaConfig
from streamer.decode.registry import Record
from streamer.runtime.records import dead_letter

pytestmark = pytest.mark.engines

Seen = tuple[bytes | None, bytes | None, dict[str, bytes]]  # key, value, headers


async def _topic(bootstrap: str, max_message_bytes: int | None = None) -> str:
    topic = f"size-{uuid.uuid4().hex[:8]}"
    configs = {} if max_message_bytes is None else {"max.message.bytes": str(max_message_bytes)}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, topic_configs=configs)])
    finally:
        await admin.close()
    return topic


async def _limit(bootstrap: str, topic: str, max_message_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        configs = {"max.message.bytes": str(max_message_bytes)}
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs=configs)])
    finally:
        await admin.close()


async def _read(bootstrap: str, topic: str, expect: int) -> list[Seen]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)  # fmt: skip
    await consumer.start()
    seen: list[Seen] = []
    try:
        for _ in range(50):
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                seen += [(m.key, m.value, dict(m.headers)) for m in messages]
            if len(seen) >= expect:
                break
    finally:
        await consumer.stop()
    return seen


async def test_a_dead_letter_too_large_for_its_topic_is_trimmed_with_its_size_and_digest(kafka_bootstrap: str) -> None:
    """A 64 KiB input dead-lettered to a topic that takes 4 KiB arrives cut to fit, saying how large it was and its
    SHA-256, with its reason and position; the next dead letter follows it."""
    dlq = await _topic(kafka_bootstrap, max_message_bytes=4096)
    original = bytes(range(256)) * 256
    record = Record("otlp_spans", 3, 41, b"trace-key", original, 0)
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap, dlq_topic=dlq))
    await sink.start()
    try:
        small = Record("otlp_spans", 3, 42, None, b"small", 0)
        await sink.send([dead_letter(record, dlq, "undecodable", "not a TracesData"),
                         dead_letter(small, dlq, "undecodable", "x")])  # fmt: skip
    finally:
        await sink.close()
    (key, value, headers), (_, after, _) = await _read(kafka_bootstrap, dlq, 2)
    assert after == b"small"
    assert key == b"trace-key" and value is not None and 0 < len(value) < 4096 and original.startswith(value)
    assert headers["truncated"] == str(len(original)).encode()
    assert headers["original.sha256"] == hashlib.sha256(original).hexdigest().encode()
    assert (headers["reason"], headers["source.topic"], headers["source.offset"]) == (
        b"undecodable",
        b"otlp_spans",
        b"41",
    )
    assert sink.telemetry.events["trimmed"] == 1 and sink.limits[dlq] == 4096


async def test_an_output_message_too_large_is_dead_lettered_and_the_producer_goes_on(kafka_bootstrap: str) -> None:
    """An incident larger than its topic takes goes to the dead-letter topic (reason ``too_large``, counted); the
    messages around it are delivered in order, and so is the next send to the same partition."""
    incidents, dlq = await _topic(kafka_bootstrap, max_message_bytes=2000), await _topic(kafka_bootstrap)
    big = b"{" + b"x" * 10_000 + b"}"
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap, incidents_topic=incidents, dlq_topic=dlq))
    await sink.start()
    try:
        await sink.send([Message(incidents, b"fp", b"first"), Message(incidents, b"fp", big),
                         Message(incidents, b"fp", b"second")])  # fmt: skip
        await sink.send([Message(incidents, b"fp", b"third")])
    finally:
        await sink.close()
    assert [v for _, v, _ in await _read(kafka_bootstrap, incidents, 3)] == [b"first", b"second", b"third"]
    [(key, value, headers)] = await _read(kafka_bootstrap, dlq, 1)
    assert (key, value) == (b"fp", big) and headers["reason"] == b"too_large"
    assert headers["source.topic"] == incidents.encode()
    assert sink.telemetry.dropped["too_large"] == 1


async def test_a_limit_lowered_after_start_is_learned_from_the_refusal(kafka_bootstrap: str) -> None:
    """The topic's limit drops below a message after the sink read it: the broker's refusal makes the sink read the
    limit again and dead-letter that message; the rest is delivered in order, by a new producer (the refused batch
    left a gap in the old one's sequence numbers), and later sends go through."""
    topic, dlq = await _topic(kafka_bootstrap, max_message_bytes=100_000), await _topic(kafka_bootstrap)
    big = b"y" * 10_000
    sink = KafkaSink(KafkaConfig(bootstrap=kafka_bootstrap, dlq_topic=dlq))
    await sink.start()
    try:
        await sink.send([Message(topic, b"k", b"before")])
        await _limit(kafka_bootstrap, topic, 2000)
        await sink.send([Message(topic, b"k", b"first"), Message(topic, b"k", big), Message(topic, b"k", b"second")])
        await sink.send([Message(topic, b"k", b"after")])
    finally:
        await sink.close()
    assert [v for _, v, _ in await _read(kafka_bootstrap, topic, 4)] == [b"before", b"first", b"second", b"after"]
    [(_, value, headers)] = await _read(kafka_bootstrap, dlq, 1)
    assert value == big and headers["reason"] == b"too_large"
    assert sink.limits[topic] == 2000 and sink.telemetry.events["renewals"] >= 1
