"""An in-process daemon on the real engines, with its own topics, consumer group and graph per test."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from falkordb import FalkorDB

from streamer import config
from streamer.components import Components
from streamer.config import Settings
from streamer.runtime.app import Daemon
from streamer.runtime.topics import create_topics


@dataclass
class Harness:
    settings: Settings
    bootstrap: str
    falkordb_url: str
    daemon: Daemon | None = None
    task: asyncio.Task[int] | None = None
    components: Components | None = None

    def graph_rows(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        host, port = self.falkordb_url.removeprefix("redis://").split(":")
        graph = FalkorDB(host=host, port=int(port)).select_graph(self.settings.graph_name)
        return [list(r) for r in graph.query(cypher, params or {}).result_set]

    def count(self, cypher: str) -> int:
        rows = self.graph_rows(cypher)
        return int(rows[0][0]) if rows else 0

    async def create_topics(self, *topics: str, partitions: int = 1) -> None:
        await create_topics(self.bootstrap, dict.fromkeys(topics, partitions))

    async def start(self) -> None:
        k = self.settings.kafka
        await self.create_topics(k.spans_topic, k.logs_topic)
        self.daemon = Daemon(self.settings, components=self.components)
        self.task = asyncio.create_task(self.daemon.run())
        deadline = time.monotonic() + 60
        while not self.daemon.started or any(r.consumer is None or not r.consumer.assignment()
                                              for r in self.daemon.runners):  # fmt: skip
            if self.task.done():
                raise AssertionError(f"the daemon stopped while starting (exit status {self.task.result()})")
            assert time.monotonic() < deadline, "daemon did not become ready"
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self.daemon is not None and self.task is not None:
            self.daemon.stop.set()
            await asyncio.wait_for(self.task, 60)
            self.daemon = None

    async def produce(self, topic: str, values: list[bytes | None], key: bytes | None = b"k") -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, max_request_size=16 * 1024 * 1024)
        await producer.start()
        try:
            for v in values:
                await producer.send_and_wait(topic, v, key=key)
        finally:
            await producer.stop()

    async def consume_all(self, topic: str, expect: int, timeout_s: float = 30) -> list[Any]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
                                    group_id=f"read-{uuid.uuid4().hex[:8]}")  # fmt: skip
        await consumer.start()
        out: list[Any] = []
        try:
            deadline = time.monotonic() + timeout_s
            while len(out) < expect and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                out += [m for ms in batch.values() for m in ms]
        finally:
            await consumer.stop()
        return out

    def drained(self) -> bool:
        """Every stage has committed up to the end of what it consumed, and holds no open state."""
        if self.daemon is None or not self.daemon.runners:
            return False
        for runner in self.daemon.runners:
            consumer = runner.consumer
            if consumer is None:
                return False
            for tp in consumer.assignment():
                end = consumer.highwater(tp)
                if end is None:
                    return False
                if end and (runner._positions.get(tp) != end or runner._committed.get(tp) != end):
                    return False  # (an empty partition has nothing to drain)
        return True

    def metric_total(self, sample: str) -> float:
        """The sum of a metric's samples over all label values."""
        assert self.daemon is not None
        return sum(
            s.value for family in self.daemon.metrics.registry.collect() for s in family.samples if s.name == sample
        )

    def snapshot(self) -> list[tuple[Any, ...]]:
        """Every node and edge with its properties, sorted: two equal snapshots mean two identical graphs."""
        nodes = self.graph_rows("MATCH (n) RETURN labels(n)[0], properties(n)")
        edges = self.graph_rows(
            "MATCH (a)-[r]->(b) RETURN type(r), properties(r), labels(a)[0], properties(a), labels(b)[0], properties(b)"
        )
        return sorted(repr(row) for row in nodes + edges)  # type: ignore[return-value]

    async def wait_for(self, predicate: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.task is not None and self.task.done():
                raise AssertionError(f"the daemon stopped (exit status {self.task.result()}) waiting for {what}")
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.2)


def harness_settings(kafka_bootstrap: str, falkordb_url: str, components: Components | None = None,
                     **overrides: str) -> Settings:  # fmt: skip
    env = harness_env(kafka_bootstrap, falkordb_url, **overrides)
    return config.load(None, env=env, factories=components.factories if components is not None else None)


def harness_env(kafka_bootstrap: str, falkordb_url: str, **overrides: str) -> dict[str, str]:
    """``TRACE_REPRO_*`` for a test daemon: its own group, graph and topics, quick event time (a subprocess gets
    these as its environment)."""
    tag = uuid.uuid4().hex[:8]
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"test_{tag}",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": f"spans-{tag}",
        "TRACE_REPRO_KAFKA__LOGS_TOPIC": f"logs-{tag}",
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^cdc{tag}\.[^.]+\.[^.]+$",
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": f"accesses-{tag}",
        "TRACE_REPRO_KAFKA__ACCESSES_PARTITIONS": "2",
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": f"dlq-{tag}",
        "TRACE_REPRO_KAFKA__INCIDENTS_TOPIC": f"incidents-{tag}",
        "TRACE_REPRO_KAFKA__REPROS_TOPIC": f"repros-{tag}",
        "TRACE_REPRO_KAFKA__VERDICTS_TOPIC": f"verdicts-{tag}",
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.5",
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
        "TRACE_REPRO_WINDOWS__IDLE_S": "0.5",
        "TRACE_REPRO_WINDOWS__WINDOW_S": "2",
        "TRACE_REPRO_HTTP__PORT": "0",
    }
    env.update({f"TRACE_REPRO_{k.upper()}": v for k, v in overrides.items()})
    return env


def shipped_event_time(env: dict[str, str]) -> dict[str, str]:
    """``env`` without its event-time overrides: windows, trace gap, lateness and idleness as shipped."""
    return {key: value for key, value in env.items() if not key.startswith("TRACE_REPRO_WINDOWS__")}
