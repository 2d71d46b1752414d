"""The shipped configuration, unchanged, finds an app-computed lost update on the sample shop (live).

Only what a deployment must set is set from the environment (the engines' addresses, topic and group names, the
HTTP port); every event-time and detection setting is config/trace-repro.toml's: trace gap 10 s, lateness 5 s, idle
5 s, causal window 2 s. The shop's checkout race (capture_payment and the expire_cart job each read an order and
write the status they computed) runs on PostgreSQL, its row changes come from the real Debezium connector.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from bench.shop import db
from bench.shop.traffic import run_traffic
from streamer import config
from streamer.engines import LocalEngines
from tests.harness import Harness

pytestmark = pytest.mark.engines

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "trace-repro.toml"


async def test_shipped_config_finds_an_app_computed_lost_update(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str
) -> None:
    """With the file's settings, the lost update is reported with its culprit, victim and credited commits."""
    tag = uuid.uuid4().hex[:8]
    prefix = f"d{tag}"
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"default_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.public\.[a-z]+$",
        **{f"TRACE_REPRO_KAFKA__{t.upper()}_TOPIC": f"{t}-{tag}"
           for t in ("spans", "logs", "accesses", "dlq", "incidents", "repros", "verdicts", "contracts")},
    }  # fmt: skip
    settings = config.load(SHIPPED, env=env)
    assert (settings.windows.trace_gap_s, settings.windows.allowed_lateness_s, settings.windows.idle_s) == (10, 5, 5)
    await asyncio.to_thread(db.apply_schema, engines.address("postgres"))
    await asyncio.to_thread(engines.capture, ["public.orders", "public.inventory", "public.charges"],
                            topic_prefix=prefix)  # fmt: skip
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    await harness.create_topics(*(f"{prefix}.public.{t}" for t in ("orders", "inventory", "charges")))
    try:
        await harness.start()
        dsn, topic = engines.address("postgres"), settings.kafka.spans_topic
        summary = await asyncio.to_thread(run_traffic, dsn, kafka_bootstrap, scenario="lost_update", rounds=1,
                                          topic=topic)  # fmt: skip
        assert summary.result("lost_update").manifested == 1
        [message] = await harness.consume_all(settings.kafka.incidents_topic, expect=1, timeout_s=90)
        incident = json.loads(message.value)
        assert incident["anomaly"] == "lost_update" and incident["manifest"]
        assert {incident["culprit"]["function"], incident["victim"]["function"]} == {
            "shop.handlers.capture_payment", "shop.jobs.expire_cart"}  # fmt: skip
        writers = {incident["culprit"]["trace_id"], incident["victim"]["trace_id"]}
        assert {c["trace_id"] for c in incident["commits"]} == writers  # each commit credited to its own writer
        assert all(c["correlation"] != "none" for c in incident["commits"])
    finally:
        await harness.stop()
