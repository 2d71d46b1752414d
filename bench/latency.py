"""Detection latency: from the last event of a collision produced to Kafka until its incident is published.

Two settings: *tuned* (trace gap 1 s, causal window 1 s, settle 0.5 s, idle 0.5 s; rounds back to back) and the
*shipped defaults* (config/trace-repro.toml's trace gap 10 s, lateness 5 s, idle 5 s, window 2 s, settle 1 s),
where each round is isolated: the next starts only once the last one's incidents are out, so every collision is
followed by silence, the case where event time must catch up on its own (target: gap + window + settle + 1 s).

For each incident, the collision's last input event is the latest Kafka record (by the broker's CreateTime) among
the span messages of its culprit and victim traces (the shop's exporter keys messages by trace id) and the row
changes Debezium produced for its entity. Latency = the incident record's CreateTime minus that. Both timestamps
come from the same broker clock.

Correctness: the planted defects are the rows where the database's own evidence (``bench.shop.evidence``, asked
row by row) shows the damage; the manifest incidents must be exactly those rows, each found, none elsewhere
(``as_planted``). Latent incidents (a collision that did no damage) on a raced row are reported, not failed.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer

from bench.shop import db, evidence
from bench.shop.evidence import ScenarioResult
from bench.shop.traffic import run_traffic
from processors.detectors.collisions.config import CollisionConfig
from streamer import config, logs
from streamer.engines import LocalEngines
from streamer.runtime.app import Daemon
from streamer.runtime.topics import create_topics

SHOP = {
    "TRACE_REPRO_SQL__KEY_COLUMNS": json.dumps({"inventory": ["sku"]}),
    "TRACE_REPRO_SQL__INSERT_IDENTITY": json.dumps({"charges": ["order_id"]}),
    "TRACE_REPRO_COLLISIONS__INVARIANTS": json.dumps({"inventory": ["stock >= 0"]}),
}


TABLES = ("orders", "inventory", "charges")
EVIDENCE: dict[str, tuple[str, Callable[[str, Any], dict[str, int]]]] = {  # scenario -> (table, row evidence)
    "lost_update": ("orders", evidence.lost_updates),
    "oversell": ("inventory", evidence.oversold),
    "double_charge": ("charges", evidence.double_charges),
}


def row_key(entity: str) -> str:
    """The key part of an entity (``orders:8812`` -> ``8812``; ``charges:order_id=7`` -> ``7``)."""
    return entity.split(":", 1)[-1].rsplit("=", 1)[-1]


def planted_rows(dsn: str, results: list[ScenarioResult]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(table -> keys of the rows where a defect manifested, table -> keys of every raced row)."""
    planted: dict[str, set[str]] = {}
    raced: dict[str, set[str]] = {}
    for r in results:
        table, rows = EVIDENCE[r.scenario]
        for target in r.targets:
            raced.setdefault(table, set()).add(str(target))
            if rows(dsn, [target])["manifested"]:
                planted.setdefault(table, set()).add(str(target))
    return planted, raced


def as_planted(
    incidents: list[dict[str, Any]], planted: dict[str, set[str]], raced: dict[str, set[str]]
) -> dict[str, Any]:
    """Per table: planted rows, rows with a manifest incident, missed, unexpected; ``ok`` when they agree."""
    out: dict[str, Any] = {"ok": True, "tables": {}}
    for table in sorted(set(planted) | set(raced) | {e["table"].rsplit(".", 1)[-1] for e in incidents}):
        mine = [e for e in incidents if e["table"].rsplit(".", 1)[-1] == table]
        found = {row_key(e["entity"]) for e in mine if e.get("manifest")}
        latent = {row_key(e["entity"]) for e in mine if not e.get("manifest")}
        want = planted.get(table, set())
        missed, unexpected = want - found, (found - want) | (latent - raced.get(table, set()))
        out["tables"][table] = {"planted": len(want), "found": len(found), "latent": len(latent),
                                "missed": sorted(missed), "unexpected": sorted(unexpected)}  # fmt: skip
        out["ok"] = out["ok"] and not missed and not unexpected
    return out


async def _records(bootstrap: str, topics: list[str], stop_after_idle_s: float = 3.0) -> list[Any]:
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"lat-{uuid.uuid4().hex[:8]}", enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    out: list[Any] = []
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < stop_after_idle_s:
            batch = await consumer.getmany(timeout_ms=300)
            got = [r for rs in batch.values() for r in rs]
            if got:
                idle_since = time.monotonic()
            out += got
    finally:
        await consumer.stop()
    return out


def _incidents(daemon: Daemon) -> float:
    return sum(s.value for m in daemon.metrics.incidents.collect() for s in m.samples if s.name.endswith("_total"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def measure(engines: LocalEngines, *, rounds: int = 10, trace_gap_s: float = 1.0, window_s: float = 1.0,
                  settle_s: float = 0.5, defaults: bool = False) -> dict[str, Any]:  # fmt: skip
    """Run the buggy shop for ``rounds`` rounds of each defect under the daemon; latency figures per incident.

    ``defaults``: the shipped event-time settings, each round isolated (see the module docstring)."""
    logs.configure("WARNING")  # the in-process daemon's per-incident lines would bury the figures
    tag = uuid.uuid4().hex[:8]
    prefix = f"lat{tag}"
    bootstrap = engines.address("kafka")
    dsn = engines.address("postgres")
    env = {
        **SHOP,
        "TRACE_REPRO_KAFKA_BOOTSTRAP": bootstrap,
        "TRACE_REPRO_FALKORDB_URL": engines.address("falkordb"),
        "TRACE_REPRO_ENVIRONMENT": f"latency_{tag}",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"latency-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": f"spans-{tag}",
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.public\.[a-z]+$",
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": f"accesses-{tag}",
        "TRACE_REPRO_KAFKA__INCIDENTS_TOPIC": f"incidents-{tag}",
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": f"dlq-{tag}",
        "TRACE_REPRO_KAFKA__POLL_TIMEOUT_MS": "50",
        "TRACE_REPRO_HTTP__PORT": "0",
    }
    tuned = {
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": str(trace_gap_s),
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
        "TRACE_REPRO_WINDOWS__IDLE_S": "0.5",
        "TRACE_REPRO_COLLISIONS__WINDOW_S": str(window_s),
        "TRACE_REPRO_COLLISIONS__SETTLE_S": str(settle_s),
    }
    if not defaults:
        env.update(tuned)
    settings = config.load(None, env=env)
    collisions = settings.section("collisions", CollisionConfig)
    trace_gap_s, window_s, settle_s = settings.windows.trace_gap_s, collisions.window_s, collisions.settle_s
    await asyncio.to_thread(db.apply_schema, dsn)
    await asyncio.to_thread(engines.capture, ["public.orders", "public.inventory", "public.charges"],
                            topic_prefix=prefix)  # fmt: skip
    # Steady state: the topics exist before traffic starts (in production they do). A topic created later
    # is found by the pattern subscription within metadata_max_age_ms and costs a rebalance.
    await create_topics(
        bootstrap, dict.fromkeys([settings.kafka.spans_topic, *(f"{prefix}.public.{t}" for t in TABLES)], 1)
    )
    daemon = Daemon(settings)
    task = asyncio.create_task(daemon.run())
    try:
        while not daemon.started:  # noqa: ASYNC110 - polling another component's state
            await asyncio.sleep(0.05)
        want = 0
        ran: list[ScenarioResult] = []
        for _ in range(rounds if defaults else 1):  # isolated rounds: wait for each round's incidents
            summary = await asyncio.to_thread(run_traffic, dsn, bootstrap, scenario="all",
                                              rounds=1 if defaults else rounds,
                                              topic=settings.kafka.spans_topic)  # fmt: skip
            want += sum(r.manifested for r in summary.results)
            ran += summary.results
            deadline = time.monotonic() + 120
            while _incidents(daemon) < want and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    finally:
        daemon.stop.set()
        await asyncio.wait_for(task, 60)
    topics = [settings.kafka.spans_topic, settings.kafka.incidents_topic, settings.kafka.accesses_topic,
              *(f"{prefix}.public.{t}" for t in TABLES)]  # fmt: skip
    records = await _records(bootstrap, topics)
    last_by_trace: dict[str, int] = {}
    last_by_row: dict[str, int] = {}
    incidents = []
    last_access: dict[str, int] = {}
    for r in records:
        if r.topic == settings.kafka.spans_topic and r.key:
            trace = r.key.decode()
            last_by_trace[trace] = max(last_by_trace.get(trace, 0), r.timestamp)
        elif r.topic == settings.kafka.incidents_topic:
            incidents.append((r.timestamp, json.loads(r.value)))
        elif r.topic == settings.kafka.accesses_topic:
            if r.key is None:
                continue  # stage 1's watermarks
            entity = r.key.decode()
            if json.loads(r.value)["kind"] == "access":
                last_access[entity] = max(last_access.get(entity, 0), r.timestamp)
        elif r.value:
            table = r.topic.rsplit(".", 1)[-1]
            key = json.loads(r.key) if r.key else {}
            value = json.loads(r.value)
            image = value.get("after") or value.get("before") or {}
            row = (
                f"{table}:order_id={image.get('order_id')}"
                if table == "charges"
                else f"{table}:{next(iter(key.values()), '')}"
            )
            last_by_row[row] = max(last_by_row.get(row, 0), r.timestamp)
    latencies, ingest, judge = [], [], []
    for published_ms, event in incidents:
        inputs = [last_by_trace.get(event["culprit"]["trace_id"], 0), last_by_trace.get(event["victim"]["trace_id"], 0),
                  last_by_row.get(event["entity"], 0)]  # fmt: skip
        latencies.append((published_ms - max(inputs)) / 1000)
        handed = last_access.get(event["entity"], 0)
        ingest.append((handed - max(inputs)) / 1000)
        judge.append((published_ms - handed) / 1000)
    planted, raced = await asyncio.to_thread(planted_rows, dsn, ran)
    return {
        "rounds": rounds,
        "defects_manifested": want,
        "incidents": len(incidents),
        "as_planted": as_planted([e for _, e in incidents if e.get("kind", "incident") == "incident"], planted, raced),
        "latency_p50_s": round(percentile(latencies, 0.5), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 0.99), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "latency_min_s": round(min(latencies), 3) if latencies else None,
        "stage1_p50_s": round(percentile(ingest, 0.5), 3) if ingest else None,
        "stage2_p50_s": round(percentile(judge, 0.5), 3) if judge else None,
        "settings": {
            "defaults": defaults,
            "trace_gap_s": trace_gap_s,
            "causal_window_s": window_s,
            "settle_s": settle_s,
            "idle_s": settings.windows.idle_s,
            "allowed_lateness_s": settings.windows.allowed_lateness_s,
        },
        "floor_s": trace_gap_s + window_s + settle_s,
    }


if __name__ == "__main__":
    engines = LocalEngines()
    engines.up()
    print(json.dumps(asyncio.run(measure(engines)), indent=2))
