"""A graph row FalkorDB refuses for its content reaches the dead-letter topic, through the stage runner's durable
step, on the real Kafka and FalkorDB: with its content, the reason and FalkorDB's error, before the batch counts as
written; the other rows of the batch are in the graph."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from falkordb import FalkorDB

from processors.model.graph import GraphBatch
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter
from sinks.kafka import KafkaSink
from streamer.runtime.metrics import Metrics
from streamer.runtime.records import StageOutput
from streamer.runtime.runner import StageRunner
from streamer.runtime.topics import create_topics
from tests.harness import harness_settings

pytestmark = pytest.mark.engines


async def _messages(bootstrap: str, topic: str, expect: int) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"read-{uuid.uuid4().hex[:8]}")  # fmt: skip
    await consumer.start()
    try:
        out: list[Any] = []
        for _ in range(20):
            batch = await consumer.getmany(timeout_ms=500)
            out += [m for ms in batch.values() for m in ms]
            if len(out) >= expect:
                break
        return out
    finally:
        await consumer.stop()


async def test_a_refused_row_is_dead_lettered_with_its_content_before_the_batch_is_durable(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    settings = harness_settings(kafka_bootstrap, falkordb_url)
    k = settings.kafka
    await create_topics(kafka_bootstrap, {k.dlq_topic: 1})
    metrics = Metrics()
    graph = GraphSink(GraphWriter(falkordb_url, settings.graph_name), clock_ms=lambda: 1.0)
    producer = KafkaSink(k)
    await graph.start()
    await producer.start()
    runner = StageRunner("ingest", None, settings=settings, group_id=k.group_id, graph=graph,  # type: ignore[arg-type]
                         producer=producer, metrics=metrics)  # fmt: skip
    refused = {"id": "w2", "start": {"nested": True}, "end": 3.0}  # a map: FalkorDB takes no map property
    batch = GraphBatch(windows=[{"id": "w1", "start": 1.0, "end": 2.0}, refused, {"id": "w3", "start": 3.0}])
    try:
        await runner._durable(StageOutput(graph=batch))
        [message] = await _messages(kafka_bootstrap, k.dlq_topic, 1)
        headers = {name: value.decode() for name, value in message.headers}
        assert headers["reason"] == "graph_row_refused" and headers["graph.op"] == "windows"
        assert "Property values can only be" in headers["error"]
        assert json.loads(message.value) == {"op": "windows", "row": refused}
        db = FalkorDB(port=int(falkordb_url.rsplit(":", 1)[1]))
        ids = db.select_graph(settings.graph_name).ro_query("MATCH (w:Window) RETURN w.id ORDER BY w.id").result_set
        assert ids == [["w1"], ["w3"]]
        assert sum(s.value for s in metrics.dlq.collect()[0].samples if s.name.endswith("_total")) == 1
    finally:
        await producer.close()
        await graph.close()
        FalkorDB(port=int(falkordb_url.rsplit(":", 1)[1])).select_graph(settings.graph_name).delete()
