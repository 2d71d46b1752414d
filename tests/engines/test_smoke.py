"""Each real engine does its job: Kafka round-trips, FalkorDB answers Cypher, Debezium streams an UPDATE."""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from falkordb import FalkorDB

from streamer.engines import LocalEngines

pytestmark = pytest.mark.engines


async def test_kafka_round_trip(kafka_bootstrap: str) -> None:
    """A message produced with aiokafka is consumed back with the same key and value."""
    topic = f"smoke-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"v1", key=b"k1")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                group_id=f"g-{topic}")  # fmt: skip
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=10_000)
        records = [r for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
    assert [(r.key, r.value) for r in records] == [(b"k1", b"v1")]


def test_falkordb_cypher(falkordb_url: str) -> None:
    """A parameterised Cypher write and read run on the FalkorDB module."""
    host, port = falkordb_url.removeprefix("redis://").split(":")
    graph = FalkorDB(host=host, port=int(port)).select_graph(f"smoke_{uuid.uuid4().hex[:8]}")
    graph.query("UNWIND $rows AS r MERGE (:Entity {key: r.key, table: r.table})",
                {"rows": [{"key": "orders:1", "table": "orders"}, {"key": "orders:2", "table": "orders"}]})  # fmt: skip
    result = graph.query("MATCH (e:Entity) RETURN e.key ORDER BY e.key")
    assert [row[0] for row in result.result_set] == ["orders:1", "orders:2"]
    graph.delete()


async def test_debezium_streams_update(engines: LocalEngines, postgres_dsn: str, kafka_bootstrap: str) -> None:
    """An UPDATE on a captured table arrives on Kafka as a Debezium change event with before, after and op."""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS public.smoke_orders (id int PRIMARY KEY, status text)")
        conn.execute("ALTER TABLE public.smoke_orders REPLICA IDENTITY FULL")
        conn.execute("DELETE FROM public.smoke_orders WHERE id = 8812")
        conn.execute("INSERT INTO public.smoke_orders VALUES (8812, 'pending')")
    prefix = f"smoke{uuid.uuid4().hex[:6]}"
    engines.capture(["public.smoke_orders"], topic_prefix=prefix)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute("UPDATE public.smoke_orders SET status = 'paid' WHERE id = 8812")
    topic = f"{prefix}.public.smoke_orders"
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                group_id=f"g-{uuid.uuid4().hex[:8]}")  # fmt: skip
    await consumer.start()
    events = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(e["op"] == "u" for e in events):
            batch = await consumer.getmany(timeout_ms=1000)
            events += [json.loads(r.value) for rs in batch.values() for r in rs if r.value]
    finally:
        await consumer.stop()
    update = next(e for e in events if e["op"] == "u")
    assert update["before"] == {"id": 8812, "status": "pending"}
    assert update["after"] == {"id": 8812, "status": "paid"}
    assert update["source"]["table"] == "smoke_orders"
    assert update["source"]["lsn"] > 0
