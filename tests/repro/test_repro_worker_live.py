"""The repro worker inside the running daemon, on the anomaly corpus's tables (not the sample shop's): two corpus
scenarios played for real on PostgreSQL, Debezium and Kafka (as ``tests/corpus/test_corpus_live.py`` plays them, in a
schema and under a topic prefix of this run's own), the daemon with its default configuration plus the repro worker
pointed at this checkout and the scenarios' DDL, with no call specs. Each incident's repro is published on the
repros topic: the lost update of ``corpus_accounts`` at SQL level (its function cannot be called from the spans),
the oversell of ``corpus_stock`` at application level (derived specs), each RED, faithful, and GREEN.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.corpus.apps import SCENARIOS
from bench.corpus.runner import drop_schema, prepare, run_scenario
from streamer import config
from streamer.engines import LocalEngines
from tests.harness import Harness

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]
TOPICS = ("spans", "logs", "accesses", "dlq", "incidents", "repros", "verdicts", "contracts")
PLAYED = ("lost_update", "invariant_violation")
EXPECTED = {  # anomaly -> (its table, the repro's level, the planner's first strategy)
    "lost_update": ("corpus_accounts", "sql", "row_lock"),
    "invariant_violation": ("corpus_stock", "app", "atomic_update"),
}


async def repros(harness: Harness, topic: str, anomalies: set[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """The first repro published for each of ``anomalies``, polled until all are there (or the time is up)."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and set(found) != anomalies:
        for m in await harness.consume_all(topic, expect=len(anomalies), timeout_s=3):
            event = json.loads(m.value)
            if event.get("kind") == "repro":
                found.setdefault(event["anomaly"], event)
    return found


async def test_the_daemon_proves_corpus_incidents_red_then_green(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """Through the daemon: a SQL-level repro RED→GREEN on ``corpus_accounts`` and an application-level one with
    derived call specs on ``corpus_stock``, both proven."""
    tag = uuid.uuid4().hex[:8]
    prefix = schema = f"corpus_{tag}"
    dsn = engines.address("postgres")
    played = [SCENARIOS[name] for name in PLAYED]
    ddl = tmp_path / "schema.sql"
    ddl.write_text("\n".join(s.schema_sql for s in played), encoding="utf-8")
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_POSTGRES_DSN": dsn,
        "TRACE_REPRO_ENVIRONMENT": f"corpus_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.{schema}\.[a-z_]+$",
        "TRACE_REPRO_REPRO__ENABLED": "true",
        "TRACE_REPRO_REPRO__SOURCE_ROOT": str(REPO),
        "TRACE_REPRO_REPRO__SCHEMA_SQL": str(ddl),
        "TRACE_REPRO_REPRO__OUTPUT_DIR": str(tmp_path / "repros"),
        **{f"TRACE_REPRO_KAFKA__{t.upper()}_TOPIC": f"{t}-{tag}" for t in TOPICS},
    }
    settings = config.load(None, env=env)
    runs = [(s, s.plans(1)) for s in played]
    tables = [t.name for s, _ in runs for t in s.tables]
    await asyncio.to_thread(prepare, dsn, runs, schema=schema)
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    await harness.create_topics(*(f"{prefix}.{schema}.{t}" for t in tables), settings.kafka.repros_topic)
    await asyncio.to_thread(engines.capture, [f"{schema}.{t}" for t in tables], topic_prefix=prefix)
    try:
        await harness.start()
        for scenario, plans in runs:
            await asyncio.to_thread(run_scenario, scenario, plans, dsn=dsn, kafka_bootstrap=kafka_bootstrap,
                                    spans_topic=settings.kafka.spans_topic, schema=schema)  # fmt: skip
        found = await repros(harness, settings.kafka.repros_topic, set(EXPECTED), timeout_s=300)
    finally:
        await harness.stop()
        await asyncio.to_thread(drop_schema, dsn, schema)
    assert set(found) == set(EXPECTED), sorted(found)
    for anomaly, (table, level, strategy) in EXPECTED.items():
        event = found[anomaly]
        assert f"TABLE: str = {table!r}" in event["test_source"], anomaly
        assert (event["level"], event["red"]["status"]) == (level, "failed"), (table, event["red"])
        assert event["divergence"]["faithful"], (table, event["divergence"])
        assert [r["strategy"] for r in event["repairs"]] == [strategy], table
        assert event["green"] is not None and event["green"]["status"] == "passed", (table, event["green"])
        assert event["proven"], table
