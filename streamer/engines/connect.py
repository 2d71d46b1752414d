"""Kafka Connect standalone with the Debezium PostgreSQL connector (pgoutput), from Maven-resolved jars.

Its plugin path holds Debezium and Apicurio Registry's converter, so that one worker runs JSON connectors (its default
converters) and Avro ones (per-connector ``key.converter``/``value.converter``: :func:`registry.converter_config`).

The worker starts with no connector; :func:`capture` registers one over the REST API for the tables to
capture, once they exist (``publication.autocreate.mode=filtered`` creates the publication for exactly those
tables), and waits until its replication slot is active so that no later change is missed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamer.engines import jars
from streamer.engines.kafka import LOG4J2, java_command
from streamer.engines.layout import Layout
from streamer.engines.process import EngineError, free_port, spawn, wait_until
from streamer.engines.state import EngineState

CONNECTOR = "trace-repro-postgres"
SLOT = "trace_repro"


def worker_properties(bootstrap: str, rest_port: int, offsets: str, plugin_path: str) -> str:
    props = {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": offsets,
        "offset.flush.interval.ms": "1000",
        "plugin.path": plugin_path,
        "plugin.discovery": "hybrid_warn",
        "listeners": f"http://127.0.0.1:{rest_port}",
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def start(layout: Layout, *, bootstrap: str, port: int | None = None) -> EngineState:
    classpath = jars.resolve(layout, "kafka-pom.xml")
    plugins = jars.resolve(layout, "debezium-pom.xml", subdir="debezium-connector-postgres")
    avro = jars.resolve(layout, "apicurio-converter-pom.xml", subdir="apicurio-converter")  # Avro with a registry
    base = layout.run_dir / "connect"
    base.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    props = base / "worker.properties"
    props.write_text(worker_properties(bootstrap, port, str(base / "offsets.dat"), f"{plugins},{avro}"))
    log4j = base / "log4j2.properties"
    log4j.write_text(LOG4J2.format(level="INFO"))
    log = layout.log_dir / "connect.log"
    argv = java_command(classpath, "org.apache.kafka.connect.cli.ConnectStandalone", str(props), log4j=log4j,
                        opts=["-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"])  # fmt: skip
    pid = spawn(argv, log=log)
    state = EngineState("connect", pid, port, str(base), str(log), {"java": jars.require_java().describe()})
    wait_until(lambda: healthy(state), what="Kafka Connect", timeout_s=120, pid=pid, log=log)
    return state


def rest_url(state: EngineState) -> str:
    return f"http://127.0.0.1:{state.port}"


def request(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(  # noqa: S310 - an http:// URL we built
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - an http:// URL we built
        return json.loads(resp.read() or b"null")


def healthy(state: EngineState) -> bool:
    try:
        info = request(rest_url(state) + "/")
        plugins = request(rest_url(state) + "/connector-plugins")
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return "version" in info and any(p.get("class", "").endswith("PostgresConnector") for p in plugins)


def serves_avro(url: str) -> bool:
    """Whether the worker at ``url`` has Apicurio's Avro converter (a worker started before it joined the plugin path
    has not)."""
    plugins = request(f"{url}/connector-plugins?connectorsOnly=false")
    return any(p.get("class") == AVRO_CONVERTER for p in plugins)


AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"

# Forms of Debezium's output teams run, on top of ``connector_config`` (the decoder's fixtures are recorded with these
# and ``tests/runtime/test_debezium_forms_live.py`` reads them live): precise decimals with schemas, transaction
# metadata and heartbeats; and the unwrapped record (``ExtractNewRecordState``) with its added fields.
FORMS: dict[str, dict[str, str]] = {
    "precise": {
        "decimal.handling.mode": "precise",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "provide.transaction.metadata": "true",
        "heartbeat.interval.ms": "500",
    },
    "unwrap": {
        "decimal.handling.mode": "string",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.add.fields": "op,table,lsn,source.ts_ms",
        "transforms.unwrap.delete.tombstone.handling.mode": "rewrite",
    },
}
# The same through a schema registry's Avro converter (its key.converter/value.converter settings come from the
# registry: ``registry.converter_config``): the envelope with precise decimals, and the unwrapped record.
AVRO_FORMS: dict[str, dict[str, str]] = {
    "avro": {
        "decimal.handling.mode": "precise",
        "provide.transaction.metadata": "true",
        "heartbeat.interval.ms": "500",
    },
    "avro_unwrap": {
        "decimal.handling.mode": "precise",
        "transforms": "unwrap",
        "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
        "transforms.unwrap.add.fields": "op,table,lsn,source.ts_ms",
        "transforms.unwrap.delete.tombstone.handling.mode": "rewrite",
    },
}


def connector_config(pg_port: int, tables: Sequence[str], topic_prefix: str, database: str) -> dict[str, str]:
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "127.0.0.1",
        "database.port": str(pg_port),
        "database.user": "postgres",
        "database.password": "",
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "publication.autocreate.mode": "filtered",
        "publication.name": "trace_repro",
        "slot.name": SLOT,
        "table.include.list": ",".join(tables),
        "snapshot.mode": "no_data",
        "tombstones.on.delete": "true",
        "decimal.handling.mode": "string",
        "provide.transaction.metadata": "false",
        "tasks.max": "1",
        "poll.interval.ms": "100",  # local engine: deliver changes within ~0.1 s rather than the 0.5 s default
    }


def capture(
    state: EngineState,
    *,
    pg_dsn: str,
    pg_port: int,
    tables: Sequence[str],
    topic_prefix: str = "shop",
    database: str = "postgres",
    timeout_s: float = 90,
) -> None:
    """Register (or reconfigure) the Debezium connector for ``tables`` and wait until it streams.

    Reconfiguring first stops the connector and deletes its stored offsets (KIP-875): an offset saved under an
    earlier configuration can point at WAL the replication slot has already released, which Debezium refuses.
    Streaming then starts where the slot stands; with ``snapshot.mode=no_data`` nothing old is replayed.
    """
    config = connector_config(pg_port, tables, topic_prefix, database)
    base = f"{rest_url(state)}/connectors/{CONNECTOR}"
    if CONNECTOR in request(f"{rest_url(state)}/connectors"):
        request(f"{base}/stop", "PUT")
        wait_until(lambda: _status(state).get("connector", {}).get("state") == "STOPPED",
                   what="the Debezium connector's stop", timeout_s=timeout_s)  # fmt: skip
        request(f"{base}/offsets", "DELETE")
        request(f"{base}/config", "PUT", config)
        request(f"{base}/resume", "PUT")
    else:
        request(f"{base}/config", "PUT", config)
    # _running raises at once when the connector's task failed; the slot turns active once it streams.
    wait_until(lambda: _running(state) and _slot_active(pg_dsn), what="Debezium streaming", timeout_s=timeout_s,
               log=Path(state.log))  # fmt: skip


def _status(state: EngineState) -> Any:
    try:
        return request(f"{rest_url(state)}/connectors/{CONNECTOR}/status")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"error": str(exc)}


def _running(state: EngineState) -> bool:
    status = _status(state)
    tasks = status.get("tasks", [])
    if any(t.get("state") == "FAILED" for t in tasks):
        raise EngineError(f"Debezium connector task failed: {tasks[0].get('trace', '')[:2000]}")
    return status.get("connector", {}).get("state") == "RUNNING" and any(t.get("state") == "RUNNING" for t in tasks)


def _slot_active(pg_dsn: str) -> bool:
    import psycopg  # here, not at the top: the daemon (`run`) never loads the PostgreSQL driver

    try:
        with psycopg.connect(pg_dsn, connect_timeout=2) as conn:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    except psycopg.Error:
        return False
    return bool(row and row[0])
