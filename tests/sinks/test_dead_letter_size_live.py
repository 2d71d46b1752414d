"""The daemon dead-letters a message larger than its dead-letter topic takes (real Kafka, in-process daemon).

The dead-letter topic is created with ``max.message.bytes`` = 4 KiB before the daemon starts; a 64 KiB message that
is not OTLP arrives on the spans topic, then an ordinary trace. The dead-letter copy must be cut to the topic's
limit (saying so, with the original size and digest) instead of ending the stage, and the trace behind it must
reach the graph.
"""

from __future__ import annotations

import hashlib

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, ids, to_proto

pytestmark = pytest.mark.engines

LIMIT = 4096


async def test_an_oversized_dead_letter_is_trimmed_and_the_stage_goes_on(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """64 KiB of garbage to a 4 KiB dead-letter topic: one trimmed dead letter, the next trace in the graph."""
    settings = harness_settings(kafka_bootstrap, falkordb_url, graph_policy__detail="all")
    k = settings.kafka
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(k.dlq_topic, 1, 1, topic_configs={"max.message.bytes": str(LIMIT)})])
    finally:
        await admin.close()
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    shop = ShopTelemetry()
    shop.request("/orders/{id}", function="get_order")
    spans = shop.take()
    (trace_id,), _ = ids(spans)
    garbage = b"\xff" * 65536  # not a TracesData: the decoder refuses it
    try:
        await harness.start()
        await harness.produce(k.spans_topic, [garbage, to_proto(spans)])
        await harness.wait_for(lambda: harness.count("MATCH (t:Trace) RETURN count(t)") == 1, "the trace after it", 60)
        [letter] = await harness.consume_all(k.dlq_topic, expect=1, timeout_s=10)
    finally:
        await harness.stop()
    headers = dict(letter.headers)
    assert headers["truncated"] == str(len(garbage)).encode()
    assert headers["original.sha256"] == hashlib.sha256(garbage).hexdigest().encode()
    assert headers["source.topic"] == k.spans_topic.encode() and headers["source.offset"] == b"0"
    assert 0 < len(letter.value) < LIMIT and garbage.startswith(letter.value)
    assert harness.graph_rows("MATCH (t:Trace) RETURN t.id") == [[trace_id]]
