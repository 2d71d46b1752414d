"""Records the corpus: every scenario on the real engines, and every Kafka message it produced, as fixtures.

1. Engines: the running ``trace-repro local up`` ones when ``TRACE_REPRO_TEST_REUSE=1`` and all are healthy (left
   running), else a private set in a temporary run directory (stopped at the end).
2. Every scenario's tables are created afresh in ``public`` and seeded (:func:`bench.corpus.runner.prepare`), the
   topics are created (the spans topic ``corpus.otlp_spans`` with two partitions, one Debezium topic per table),
   then Debezium captures the tables with topic prefix ``corpus`` (``corpus.public.corpus_<table>``) and the
   recorder waits until its topics are quiet (a reconfigured connector may deliver its last changes again).
3. Per scenario: the end offsets of its topics are noted, its rounds run with their telemetry exported over OTLP to a
   stock OpenTelemetry Collector (``bench.collector``, the shipped ``config/otel-collector.yaml``), which writes it to
   the spans topic and is stopped after the rounds (it drains to Kafka first), the recorder waits until Debezium
   delivered one change per committed row write, and reads back every message between the noted offsets and the new
   ends: ``<scenario>.jsonl``, one JSON object per message (``topic``, ``partition``, ``offset``, ``timestamp_ms``,
   ``key`` and ``value`` as base64 of the exact bytes), ordered by timestamp.
4. Each change is attributed to the request that committed it (per row, the k-th change in log order belongs to
   the k-th committed writer of the row, the commit order the round forced) and written with the rounds to
   ``<scenario>.manifest.json``. Anything unexpected (a change no round wrote, a request without spans, a count
   that does not match) fails the recording.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.collector import build as collector_build
from bench.collector import process as collector_process
from bench.corpus.apps import SCENARIOS
from bench.corpus.manifest import ChangeRecord, Manifest, RoundRecord
from bench.corpus.runner import prepare, run_scenario
from bench.corpus.scenario import Scenario
from streamer.engines import Layout, LocalEngines
from streamer.runtime.topics import create_topics

PREFIX = "corpus"
SCHEMA = "public"
SPANS_TOPIC = "corpus.otlp_spans"
LOGS_TOPIC = "corpus.otlp_logs"
SPANS_PARTITIONS = 2
CDC_PATTERN = r"^corpus\.public\.[a-z_]+$"
ROUNDS = 3
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "corpus" / "fixtures"
TP = tuple[str, int]


@dataclass(frozen=True)
class Message:
    """One Kafka message, exactly as consumed."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None

    def to_json(self) -> str:
        def b64(data: bytes | None) -> str | None:
            return None if data is None else base64.b64encode(data).decode("ascii")

        doc = {"topic": self.topic, "partition": self.partition, "offset": self.offset,
               "timestamp_ms": self.timestamp_ms, "key": b64(self.key), "value": b64(self.value)}  # fmt: skip
        return json.dumps(doc)

    @classmethod
    def from_json(cls, line: str) -> Message:
        doc = json.loads(line)

        def raw(text: str | None) -> bytes | None:
            return None if text is None else base64.b64decode(text)

        return cls(doc["topic"], doc["partition"], doc["offset"], doc["timestamp_ms"], raw(doc["key"]),
                   raw(doc["value"]))  # fmt: skip


def cdc_topic(prefix: str, schema: str, table: str) -> str:
    return f"{prefix}.{schema}.{table}"


# ---- engines --------------------------------------------------------------------------------------------------------


@contextmanager
def local_engines(log: Callable[[str], None] = print) -> Iterator[LocalEngines]:
    """The shared engines when ``TRACE_REPRO_TEST_REUSE=1`` and healthy, else a private set, stopped at the end."""
    if os.environ.get("TRACE_REPRO_TEST_REUSE") == "1":
        shared = LocalEngines()
        if all(s.healthy for s in shared.status()):
            log(f"reusing the engines of {shared.layout.run_dir}")
            yield shared
            return
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-corpus-"))
    local = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    log(f"starting private engines in {run_dir}")
    try:
        local.up()
        yield local
    finally:
        local.down()
        shutil.rmtree(run_dir, ignore_errors=True)


# ---- Kafka ----------------------------------------------------------------------------------------------------------


async def end_offsets(bootstrap: str, tps: Sequence[TP]) -> dict[TP, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=f"corpus-ends-{os.getpid()}")  # fmt: skip
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(t, p) for t, p in tps])
        return {(tp.topic, tp.partition): int(end) for tp, end in ends.items()}
    finally:
        await consumer.stop()


async def read_range(bootstrap: str, start: dict[TP, int], end: dict[TP, int]) -> list[Message]:
    """Every message in ``[start, end)`` of each partition."""
    wanted = {tp: (start.get(tp, 0), stop) for tp, stop in end.items() if stop > start.get(tp, 0)}
    if not wanted:
        return []
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                group_id=f"corpus-read-{os.getpid()}")  # fmt: skip
    await consumer.start()
    out: list[Message] = []
    try:
        tps = {TopicPartition(t, p): bounds for (t, p), bounds in wanted.items()}
        consumer.assign(list(tps))
        for tp, (first, _) in tps.items():
            consumer.seek(tp, first)
        done: set[TopicPartition] = set()
        deadline = time.monotonic() + 60
        while len(done) < len(tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {wanted} back (done: {done})")
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                stop = tps[tp][1]
                out += [Message(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value)
                        for r in records if r.offset < stop]  # fmt: skip
                if records and records[-1].offset >= stop - 1:
                    done.add(tp)
                    consumer.pause(tp)
    finally:
        await consumer.stop()
    return out


async def wait_for_changes(bootstrap: str, tps: Sequence[TP], start: dict[TP, int], expected: int, *,
                           timeout_s: float = 90, quiet_s: float = 2.0) -> dict[TP, int]:  # fmt: skip
    """Wait until ``expected`` messages arrived on ``tps`` since ``start`` and nothing more for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        ends = await end_offsets(bootstrap, tps)
        arrived = sum(ends[tp] - start.get(tp, 0) for tp in tps)
        if arrived >= expected:
            await asyncio.sleep(quiet_s)
            again = await end_offsets(bootstrap, tps)
            if again == ends:
                return ends
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"Debezium delivered {arrived} of {expected} row changes on {list(tps)}")
        await asyncio.sleep(0.25)


# ---- attribution ----------------------------------------------------------------------------------------------------


def _change(message: Message) -> tuple[str, dict[str, Any]] | None:
    """(entity, envelope) of a Debezium message; None for a tombstone."""
    if not message.value:
        return None
    envelope = json.loads(message.value)
    key = json.loads(message.key) if message.key else {}
    entity = f"{envelope['source']['table']}:" + "|".join(str(v) for v in key.values())
    return entity, envelope


def attribute(rounds: Sequence[RoundRecord], messages: Sequence[Message], spans_topic: str) -> list[RoundRecord]:
    """The rounds with their row changes, each credited to the request that committed it; see the module doc."""
    by_entity: dict[str, list[tuple[Message, dict[str, Any]]]] = {}
    for m in sorted((m for m in messages if m.topic != spans_topic), key=lambda m: (m.topic, m.partition, m.offset)):
        decoded = _change(m)
        if decoded is not None:
            by_entity.setdefault(decoded[0], []).append((m, decoded[1]))
    traced = {m.key.decode() for m in messages if m.topic == spans_topic and m.key}
    out: list[RoundRecord] = []
    for rnd in rounds:
        missing = rnd.traces - traced
        if missing:
            raise AssertionError(f"round {rnd.number}: no spans for trace(s) {sorted(missing)}")
        writers = sorted((r for r in rnd.requests if r.commit is not None), key=lambda r: r.commit or 0)
        changes: list[ChangeRecord] = []
        for entity in rnd.rows:
            mine = [r.trace_id for r in writers if entity in r.writes]
            seen = by_entity.pop(entity, [])
            if len(seen) != len(mine):
                raise AssertionError(f"round {rnd.number}: {len(seen)} change(s) of {entity}, {len(mine)} writer(s)")
            for writer, (m, envelope) in zip(mine, seen, strict=True):
                lsn, tx_id = int(envelope["source"].get("lsn") or 0), str(envelope["source"].get("txId", ""))
                changes.append(ChangeRecord(entity, m.topic, m.partition, m.offset, envelope["op"], lsn, tx_id, writer))
        out.append(replace(rnd, changes=changes))
    if by_entity:
        raise AssertionError(f"row changes no round made: {sorted(by_entity)}")
    return out


# ---- recording ------------------------------------------------------------------------------------------------------


def record_scenario(engines: LocalEngines, scenario: Scenario, out: Path, rounds: int,
                    log: Callable[[str], None] = print) -> Manifest:  # fmt: skip
    """Run one prepared and captured scenario and write its fixture and manifest."""
    bootstrap, dsn = engines.address("kafka"), engines.address("postgres")
    cdc = [cdc_topic(PREFIX, SCHEMA, t.name) for t in scenario.tables]
    spans_tps = [(SPANS_TOPIC, p) for p in range(SPANS_PARTITIONS)]
    cdc_tps = [(t, 0) for t in cdc]
    start = asyncio.run(end_offsets(bootstrap, spans_tps + cdc_tps))
    with tempfile.TemporaryDirectory(prefix="corpus-collector-") as work:
        binary = collector_build.binary()
        collector = collector_process.start(
            binary, kafka_bootstrap=bootstrap, spans_topic=SPANS_TOPIC, logs_topic=LOGS_TOPIC, work_dir=Path(work)
        )
        try:
            records = run_scenario(scenario, scenario.plans(rounds), dsn=dsn, kafka_bootstrap=bootstrap,
                                   spans_topic=SPANS_TOPIC, schema=SCHEMA, log=log,
                                   otlp_endpoint=collector.http_endpoint)  # fmt: skip
        finally:
            collector.stop()  # it drains its batches to Kafka before it exits
    writes = sum(len(r.writes) for rnd in records for r in rnd.requests if r.commit is not None)
    ends = asyncio.run(wait_for_changes(bootstrap, cdc_tps, start, writes))
    ends.update(asyncio.run(end_offsets(bootstrap, spans_tps)))
    messages = asyncio.run(read_range(bootstrap, start, ends))
    records = attribute(records, messages, SPANS_TOPIC)
    manifest = Manifest(scenario=scenario.name, service=scenario.service, version="1.0.0",
                        isolation="read committed", spans_topic=SPANS_TOPIC, cdc_topics=cdc,
                        tables={t.name: list(t.key) for t in scenario.tables}, rounds=records)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    ordered = sorted(messages, key=lambda m: (m.timestamp_ms, m.topic, m.partition, m.offset))
    (out / f"{scenario.name}.jsonl").write_text("".join(m.to_json() + "\n" for m in ordered), encoding="utf-8")
    (out / f"{scenario.name}.manifest.json").write_text(manifest.to_json(), encoding="utf-8")
    spans = sum(1 for m in messages if m.topic == SPANS_TOPIC)
    log(f"{scenario.name}: {len(records)} rounds, {spans} span messages, {len(messages) - spans} row changes")
    return manifest


def record(out: Path = FIXTURES, names: Sequence[str] = tuple(SCENARIOS), rounds: int = ROUNDS,
           log: Callable[[str], None] = print) -> list[Manifest]:  # fmt: skip
    """Record ``names`` into ``out``; see the module docstring."""
    scenarios = [SCENARIOS[n] for n in names]
    with local_engines(log) as engines:
        bootstrap, dsn = engines.address("kafka"), engines.address("postgres")
        prepare(dsn, [(s, s.plans(rounds)) for s in scenarios], schema=SCHEMA)
        tables = [t.name for s in scenarios for t in s.tables]
        topics = {SPANS_TOPIC: SPANS_PARTITIONS, **{cdc_topic(PREFIX, SCHEMA, t): 1 for t in tables}}
        asyncio.run(create_topics(bootstrap, topics))
        log(f"capturing {', '.join(tables)} into {PREFIX}.{SCHEMA}.*")
        engines.capture([f"{SCHEMA}.{t}" for t in tables], topic_prefix=PREFIX)
        # Debezium delivers at least once: after a reconfiguration it may deliver the last changes again. Those
        # come now, before any scenario notes where its messages start.
        cdc_tps = [(cdc_topic(PREFIX, SCHEMA, t), 0) for t in tables]
        asyncio.run(wait_for_changes(bootstrap, cdc_tps, asyncio.run(end_offsets(bootstrap, cdc_tps)), 0, quiet_s=5))
        return [record_scenario(engines, s, out, rounds, log) for s in scenarios]
