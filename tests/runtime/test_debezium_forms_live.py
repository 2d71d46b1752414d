"""The daemon reads topics of a Debezium connector it did not configure, in the forms teams run it with.

A second connector, registered on the local Kafka Connect over its REST API as a platform team's would be (its own
name, topic prefix, slot and publication), streams a table with NUMERIC columns: once with Debezium's default
``decimal.handling.mode=precise`` and schemas, transaction metadata and heartbeats; once unwrapped
(``ExtractNewRecordState``, ``add.fields``, deletes rewritten); once in Avro through Apicurio Registry's converter
(precise decimals, transaction metadata and heartbeats), the daemon reading the schemas from that registry. The
daemon, pointed at the connector's topics by ``kafka.cdc_pattern`` only (heartbeat and transaction topics included),
sends every change on to stage 2 (the collision detector's input) with its decimals exact (as
``decimal.handling.mode=string`` would give them), writes each row's latest image to the graph (the update's and the
delete's too), and dead-letters nothing: the same whatever the form.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from processors.model.events import RowChange
from streamer.decode import internal as wire
from streamer.engines import LocalEngines, connect, registry
from streamer.engines.connect import AVRO_FORMS, FORMS
from streamer.engines.state import EngineState
from tests.harness import Harness, harness_settings
from tests.runtime.avro_engines import avro_engines

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


@pytest.fixture(scope="module")
def avro(engines: LocalEngines) -> Iterator[tuple[str, EngineState]]:
    """A Connect worker with the Avro converter and a registry (the running ones, else private ones)."""
    with avro_engines(engines) as found:
        yield found


@pytest.mark.parametrize("form", [*sorted(FORMS), "avro"])
async def test_daemon_reads_a_connector_it_did_not_configure(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, form: str, request: pytest.FixtureRequest
) -> None:
    tag = f"f{uuid.uuid4().hex[:8]}"
    admin, pg_port, url = engines.address("postgres"), engines.engines["postgres"].port, engines.address("connect")
    converters = {"key.converter": "org.apache.kafka.connect.json.JsonConverter",
                  "value.converter": "org.apache.kafka.connect.json.JsonConverter", **FORMS.get(form, {})}  # fmt: skip
    overrides = {}
    if form == "avro":
        url, found = request.getfixturevalue("avro")
        converters = AVRO_FORMS[form] | registry.converter_config(found)
        overrides = {"decode__schema_registry__url": registry.url(found)}
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
        "poll.interval.ms": "100", **converters,
    }  # fmt: skip
    slot_active = f"SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{tag}' AND active"
    pattern = rf"^(__debezium-heartbeat\.)?{tag}(\.transaction|\.public\.\w+)?$"  # every topic of the connector
    settings = harness_settings(kafka_bootstrap, falkordb_url, kafka__cdc_pattern=pattern, **overrides)
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

        seen: list[Any] = []

        def imaged() -> bool:  # each row's latest image reaches the graph, its exact decimals too
            rows = harness.graph_rows("MATCH (e:Entity) WHERE e.key IN $k RETURN e.key, e.image, e.deleted, e.lsn",
                                      {"k": [f"{table}:1", f"{table}:2"]})  # fmt: skip
            found = {key: (json.loads(image), deleted, lsn) for key, image, deleted, lsn in rows}
            seen[:] = [found]
            return found == {
                f"{table}:1": ({"id": 1, "amount": "99999999.99", "ratio": "3.14159"}, False, changes[2].lsn),
                f"{table}:2": ({"id": 2, "amount": "-0.05", "ratio": "-7"}, True, changes[3].lsn),
            }

        try:
            await harness.wait_for(imaged, "the rows' latest images (after the update and the delete) in the graph")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen} (the changes' LSNs: {[c.lsn for c in changes]})") from None
        assert harness.daemon is not None
        daemon = harness.daemon

        def counted() -> bool:  # (the heartbeat and transaction topics join the subscription once they exist)
            counts = {t.component: t.events for t in daemon.metrics.telemetry.all()}["decode.debezium"]
            if form == "unwrap":
                return counts.get("unwrapped_changes", 0) == 4
            fetched = form != "avro" or counts.get("schemas_fetched", 0) >= 4  # key and value: table, beats, BEGIN/END
            return fetched and counts.get("heartbeats", 0) > 0 and counts.get("transaction_events", 0) >= 6

        await harness.wait_for(counted, "the heartbeats and transaction events counted")
        assert harness.metric_total("trace_repro_dropped_total") == 0
    finally:
        await harness.stop()
        await asyncio.to_thread(connect.request, f"{url}/connectors/{tag}", "DELETE")
        await asyncio.to_thread(_until, "the slot released", lambda: _sql(dsn, slot_active) == [(0,)], 60)
        await asyncio.to_thread(_sql, dsn, DROP_SLOT.format(tag),
                                f"DROP PUBLICATION IF EXISTS {tag}", f"DROP TABLE {table}")  # fmt: skip
