"""The anomaly corpus live: every scenario for real on PostgreSQL, Debezium, Kafka and FalkorDB, and the daemon on it.

One round of each bug and of each control per scenario, in a PostgreSQL schema and under a Debezium topic prefix of
this test run's own (the tables are created afresh there, so nothing clashes with another run or with the recorded
fixtures; the SQL is the same, unqualified, found through ``search_path``). The services export OTLP to a stock
OpenTelemetry Collector (``bench.collector`` on the shipped ``config/otel-collector.yaml``), which writes their spans
to the daemon's spans topic. The daemon runs with its default configuration: only the engines' addresses, the topic and
group names, the CDC pattern and the HTTP port are set. The expectations are the replay tests'
(``tests.corpus.expectations``), on the incidents the daemon publishes. The schema is dropped at the end.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from bench.collector.process import StartCollector
from bench.corpus.apps import SCENARIOS
from bench.corpus.manifest import RoundRecord
from bench.corpus.runner import drop_schema, prepare, run_scenario
from bench.shop.telemetry import CAPTURE_PARAMETERS
from streamer import config
from streamer.engines import LocalEngines
from tests.corpus.expectations import describe, judge_round, stray_incidents
from tests.harness import Harness

pytestmark = pytest.mark.engines

JUDGED_AFTER_S = 15  # credit wait (2 s) + causal window (2 s) + settle (1 s), amply: every round has been judged
TOPICS = ("spans", "logs", "accesses", "dlq", "incidents", "repros", "verdicts", "contracts")


@pytest.mark.parametrize("capture", [True, False], ids=["parameters", "no-parameters"])
async def test_corpus_scenarios_live(
    engines: LocalEngines,
    kafka_bootstrap: str,
    falkordb_url: str,
    otel_collector: StartCollector,
    monkeypatch: pytest.MonkeyPatch,
    capture: bool,
) -> None:
    """Each bug round yields one incident of its class with culprit = first committer and victim = the other
    request; no control round yields any; no incident belongs to no bug round. Also with parameter capture off, as
    stock instrumentation sends spans: then no incident party carries a parameter or a bound key, and reads are
    keyed by their traces' writes (``by_trace`` READ edges in the graph)."""
    if not capture:
        monkeypatch.setenv(CAPTURE_PARAMETERS, "0")
    tag = uuid.uuid4().hex[:8]
    prefix = schema = f"corpus_{tag}"
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"corpus_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
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
        collector = await asyncio.to_thread(otel_collector, settings.kafka.spans_topic)
        rounds: list[RoundRecord] = []
        for scenario, plans in runs:
            rounds += await asyncio.to_thread(run_scenario, scenario, plans, dsn=dsn, kafka_bootstrap=kafka_bootstrap,
                                              spans_topic=settings.kafka.spans_topic, schema=schema,
                                              otlp_endpoint=collector.http_endpoint)  # fmt: skip
        await asyncio.to_thread(collector.stop)  # it drains its batches to Kafka before it exits
        ended_ns = time.time_ns()  # every request of every round has ended
        entities = harness.daemon.entities if harness.daemon is not None else None
        assert entities is not None
        await harness.wait_for(lambda: entities.event_time() >= ended_ns + JUDGED_AFTER_S * 1_000_000_000,
                               "stage 2's event time past the traffic", timeout_s=180)  # fmt: skip
        await asyncio.sleep(2)  # the last batch's incidents are produced before its offsets are committed
        messages = await harness.consume_all(settings.kafka.incidents_topic, expect=10_000, timeout_s=10)
        incidents: list[dict[str, Any]] = [d for m in messages if (d := json.loads(m.value))["kind"] == "incident"]
        for incident in incidents:
            print("incident:", describe(incident))
        problems = [p for rnd in rounds for p in judge_round(rnd, incidents)]
        problems += [f"stray incident: {describe(i)}" for i in stray_incidents(rounds, incidents)]
        assert not problems, "\n".join(problems)
        if not capture:
            for incident in incidents:
                parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
                assert not any(p["params"] for p in parties), describe(incident)  # parameters really were off
                assert all(p["keying"] != "bound" for p in parties), describe(incident)
            query = "MATCH (:Span)-[x:READ]->(e:Entity) WHERE x.keying = 'by_trace' RETURN e.key"
            assert {"corpus_accounts:acc-1-bug", "corpus_stock:item-1"} <= {row[0] for row in harness.graph_rows(query)}
    finally:
        await harness.stop()
        await asyncio.to_thread(drop_schema, dsn, schema)
