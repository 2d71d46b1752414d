"""A schema registry outage pauses the ingest stage like any engine outage: real Debezium Avro messages (recorded from
Apicurio's converter) wait, nothing is dead-lettered or committed past them, and once the registry answers again
every change is decoded and sent on."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from processors.model.events import RowChange
from streamer.decode import internal as wire
from tests.decode.registry_server import registry_server
from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines
FIXTURE = Path(__file__).parents[1] / "decode" / "fixtures" / "debezium_avro.json"


async def test_registry_outage_pauses_then_every_change_decodes(kafka_bootstrap: str, falkordb_url: str) -> None:
    records = [(base64.b64decode(r["key"]) if r["key"] else None, base64.b64decode(r["value"]) if r["value"] else None)
               for r in json.loads(FIXTURE.read_text()) if r["topic"].endswith(".public.prices")]  # fmt: skip
    topic = f"avro{uuid.uuid4().hex[:8]}.public.prices"
    with registry_server() as served:
        served.status = 503
        settings = harness_settings(kafka_bootstrap, falkordb_url, kafka__cdc_pattern=f"^{topic}$",
                                    decode__schema_registry__url=served.url,
                                    decode__schema_registry__retry_backoff_s="0.05",
                                    decode__schema_registry__max_retry_backoff_s="0.2")  # fmt: skip
        harness = Harness(settings, kafka_bootstrap, falkordb_url)
        await harness.create_topics(topic)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
        try:
            await harness.start()
            assert harness.daemon is not None
            daemon = harness.daemon

            def retried() -> bool:
                counts = {t.component: t.events for t in daemon.metrics.telemetry.all()}
                return counts.get("decode", {}).get("prepare_retries", 0) >= 3

            await harness.wait_for(retried, "the ingest stage asking the registry again")
            ingest = next(r for r in daemon.runners if r.name == "ingest")
            assert not {tp: n for tp, n in ingest._committed.items() if tp.topic == topic and n > 0}
            assert harness.metric_total("trace_repro_dlq_messages_total") == 0
            assert harness.metric_total("trace_repro_dropped_total") == 0

            served.status = 200
            changes: list[RowChange] = []

            async def sent_on() -> bool:
                found = await harness.consume_all(settings.kafka.accesses_topic, expect=10**9, timeout_s=2)
                events = [wire.decode(m.value or b"") for m in found]
                changes[:] = [e for e in events if isinstance(e, RowChange)]
                return len(changes) >= 4

            for _ in range(30):
                if await sent_on():
                    break
            assert sorted(c.op.value for c in changes) == ["c", "c", "d", "u"]
            await harness.wait_for(harness.drained, "every offset committed")
            assert harness.metric_total("trace_repro_dropped_total") == 0
        finally:
            await harness.stop()
