"""The daemon reads topics of a Debezium connector it did not configure, in the forms teams run it with.

A second connector, registered on the local Kafka Connect over its REST API as a platform team's would be (its own
name, topic prefix, slot and publication), streams a table with NUMERIC columns: once with Debezium's default
``decimal.handling.mode=precise`` and schemas, transaction metadata and heartbeats; once unwrapped
(``ExtractNewRecordState``, ``add.fields``, deletes rewritten). The daemon, pointed at the connector's topics by
``kafka.cdc_pattern`` only (heartbeat and transaction topics included), sends every change on to stage 2 with its
decimals exact (as ``decimal.handling.mode=string`` would give them), writes them to the graph, and dead-letters
nothing.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import psycopg
import pytest

from processors.model.events import RowChange
from streamer.decode import internal as wire
from streamer.engines import LocalEngines, connect
from streamer.engines.connect import FORMS
from tests.harness import Harness, harness_settings

pytestmark = pytest.mark.engines
DROP_SLOT = "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '{}'"
DATABASE = "debezium_forms"  # a database of its own: other tests reset the shop's tables in "postgres"


def _sql(dsn: str, *statements: str) -> list[Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        out: list[Any] = []
        for s in statements:
            cursor = conn.execute(s)
            out += cursor.fetchall() if s.startswith("SELECT") else []
        return out


def _until(what: str, check: Any, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.parametrize("form", sorted(FORMS))
async def test_daemon_reads_a_connector_it_did_not_configure(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, form: str
) -> None:
    tag = f"f{uuid.uuid4().hex[:8]}"
    admin, pg_port, url = engines.address("postgres"), engines.engines["postgres"].port, engines.address("connect")
    if not await asyncio.to_thread(_sql, admin, f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'"):
        await asyncio.to_thread(_sql, admin, f"CREATE DATABASE {DATABASE}")
    dsn = admin.rsplit("/", 1)[0] + f"/{DATABASE}"
    table = f"prices_{tag}"
    await asyncio.to_thread(_sql, dsn, f"CREATE TABLE {table} (id bigint PRIMARY KEY, amount numeric(10,2) NOT NULL, "
                            "ratio numeric)", f"ALTER TABLE {table} REPLICA IDENTITY FULL")  # fmt: skip
    connector = {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "127.0.0.1", "database.port": str(pg_port), "database.user": "postgres",
        "database.password": "", "database.dbname": DATABASE, "topic.prefix": tag, "plugin.name": "pgoutput",
        "publication.autocreate.mode": "filtered", "publication.name": tag, "slot.name": tag,
        "table.include.list": f"public.{table}", "snapshot.mode": "no_data", "tasks.max": "1",
        "poll.interval.ms": "100", "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter", **FORMS[form],
    }  # fmt: skip
    slot_active = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{tag}' AND active"
    pattern = rf"^(__debezium-heartbeat\.)?{tag}(\.transaction|\.public\.\w+)?$"  # every topic of the connector
    settings = harness_settings(kafka_bootstrap, falkordb_url, kafka__cdc_pattern=pattern)
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    try:
        await asyncio.to_thread(connect.request, f"{url}/connectors/{tag}/config", "PUT", connector)
        await asyncio.to_thread(_until, "the connector to stream", lambda: _sql(dsn, slot_active) == [(1,)])
        await harness.create_topics(f"{tag}.public.{table}")
        await harness.start()
        await asyncio.to_thread(_sql, dsn, f"INSERT INTO {table} VALUES (1, 12.50, 3.14159), (2, -0.05, -7)",
                                f"UPDATE {table} SET amount = 99999999.99 WHERE id = 1",
                                f"DELETE FROM {table} WHERE id = 2")  # fmt: skip

        changes: list[RowChange] = []

        async def read_all() -> bool:  # stage 1's row changes on the internal topic, as stage 2 reads them
            found = await harness.consume_all(settings.kafka.accesses_topic, expect=10**9, timeout_s=3)
            events = [wire.decode(m.value or b"") for m in found]
            changes[:] = sorted((e for e in events if isinstance(e, RowChange) and e.table == f"public.{table}"),
                                key=lambda c: c.lsn)  # fmt: skip
            return len(changes) >= 4

        deadline = time.monotonic() + 90
        while not await read_all():
            assert time.monotonic() < deadline, f"stage 1 sent {changes}"
        assert [(c.op.value, c.key, c.before, c.after) for c in changes] == [
            ("c", (("id", 1),), None, {"id": 1, "amount": "12.50", "ratio": "3.14159"}),
            ("c", (("id", 2),), None, {"id": 2, "amount": "-0.05", "ratio": "-7"}),
            ("u", (("id", 1),), None if form == "unwrap" else {"id": 1, "amount": "12.50", "ratio": "3.14159"},
             {"id": 1, "amount": "99999999.99", "ratio": "3.14159"}),
            ("d", (("id", 2),), {"id": 2, "amount": "-0.05", "ratio": "-7"}, None),
        ]  # fmt: skip

        def imaged() -> bool:  # the exact decimal reaches the graph (a row's first image: later ones wait on spans)
            image = harness.graph_rows("MATCH (e:Entity {key: $k}) RETURN e.image", {"k": f"{table}:2"})
            return bool(image) and json.loads(image[0][0])["amount"] == "-0.05"

        await harness.wait_for(imaged, "the row's image in the graph")
        assert harness.daemon is not None
        daemon = harness.daemon

        def counted() -> bool:  # (the heartbeat and transaction topics join the subscription once they exist)
            counts = {t.component: t.events for t in daemon.metrics.telemetry.all()}["decode.debezium"]
            if form == "unwrap":
                return counts.get("unwrapped_changes", 0) == 4
            return counts.get("heartbeats", 0) > 0 and counts.get("transaction_events", 0) >= 6

        await harness.wait_for(counted, "the heartbeats and transaction events counted")
        assert harness.metric_total("trace_repro_dropped_total") == 0
    finally:
        await harness.stop()
        await asyncio.to_thread(connect.request, f"{url}/connectors/{tag}", "DELETE")
        await asyncio.to_thread(_until, "the slot released", lambda: _sql(dsn, slot_active) == [(0,)], 60)
        await asyncio.to_thread(_sql, dsn, DROP_SLOT.format(tag),
                                f"DROP PUBLICATION IF EXISTS {tag}", f"DROP TABLE {table}")  # fmt: skip
