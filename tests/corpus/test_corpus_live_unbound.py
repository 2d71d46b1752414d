"""The anomaly corpus live with statement parameters off, as stock instrumentation sends spans.

The same scenarios as ``test_corpus_live`` on the real PostgreSQL, Debezium, Kafka and FalkorDB, the daemon on its
default configuration, but the services' psycopg instrumentation runs with ``capture_parameters=False`` (its
default; ``TRACE_REPRO_BENCH_CAPTURE_PARAMETERS=0``): no span carries a statement's values. Every bug round must still
be found with its class, culprit and victim, every control stay clean, and each incident say how its statements were
keyed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from bench.corpus.apps import SCENARIOS
from bench.corpus.manifest import RoundRecord
from bench.corpus.runner import drop_schema, prepare, run_scenario
from bench.shop.telemetry import CAPTURE_PARAMETERS
from streamer import config
from streamer.engines import LocalEngines
from tests.corpus.expectations import describe, judge_round, stray_incidents
from tests.corpus.test_corpus_live import JUDGED_AFTER_S, TOPICS
from tests.harness import Harness

pytestmark = pytest.mark.engines


async def test_corpus_scenarios_live_without_parameters(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each bug round yields one incident of its class (culprit = first committer, victim = the other request), no
    control round yields any, nothing else is reported; no statement on any incident carries a parameter."""
    monkeypatch.setenv(CAPTURE_PARAMETERS, "0")
    tag = uuid.uuid4().hex[:8]
    prefix = schema = f"unbound_{tag}"
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"unbound_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.{schema}\.[a-z_]+$",
        **{f"TRACE_REPRO_KAFKA__{t.upper()}_TOPIC": f"{t}-{tag}" for t in TOPICS},
    }
    settings = config.load(None, env=env)
    dsn = engines.address("postgres")
    runs = [(s, s.plans(1)) for s in SCENARIOS.values()]
    tables = [t.name for s, _ in runs for t in s.tables]
    await asyncio.to_thread(prepare, dsn, runs, schema=schema)
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    await harness.create_topics(*(f"{prefix}.{schema}.{t}" for t in tables))
    await asyncio.to_thread(engines.capture, [f"{schema}.{t}" for t in tables], topic_prefix=prefix)
    try:
        await harness.start()
        rounds: list[RoundRecord] = []
        for scenario, plans in runs:
            rounds += await asyncio.to_thread(run_scenario, scenario, plans, dsn=dsn, kafka_bootstrap=kafka_bootstrap,
                                              spans_topic=settings.kafka.spans_topic, schema=schema)  # fmt: skip
        ended_ns = time.time_ns()
        entities = harness.daemon.entities if harness.daemon is not None else None
        assert entities is not None
        await harness.wait_for(lambda: entities.event_time() >= ended_ns + JUDGED_AFTER_S * 1_000_000_000,
                               "stage 2's event time past the traffic", timeout_s=180)  # fmt: skip
        await asyncio.sleep(2)  # the last batch's incidents are produced before its offsets are committed
        messages = await harness.consume_all(settings.kafka.incidents_topic, expect=10_000, timeout_s=10)
        incidents: list[dict[str, Any]] = [d for m in messages if (d := json.loads(m.value))["kind"] == "incident"]
        for incident in incidents:
            parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
            print("incident:", describe(incident), incident["confidence"], sorted({p["keying"] for p in parties}))
        problems = [p for rnd in rounds for p in judge_round(rnd, incidents)]
        problems += [f"stray incident: {describe(i)}" for i in stray_incidents(rounds, incidents)]
        assert not problems, "\n".join(problems)
        for incident in incidents:
            parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
            assert not any(p["params"] for p in parties), describe(incident)  # parameters really were off
            assert all(p["keying"] != "bound" for p in parties), describe(incident)
        inferred = harness.graph_rows("MATCH (:Span)-[x:READ]->(e:Entity) WHERE x.keying = 'by_trace' RETURN e.key")
        assert {"corpus_accounts:acc-1-bug", "corpus_stock:item-1"} <= {row[0] for row in inferred}
    finally:
        await harness.stop()
        await asyncio.to_thread(drop_schema, dsn, schema)
