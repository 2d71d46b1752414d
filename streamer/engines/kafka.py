"""Apache Kafka 4.x, one KRaft node in combined broker+controller mode, from Maven-resolved jars.

Storage is formatted on first start; readiness is a successful metadata request with aiokafka.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from streamer.engines import jars
from streamer.engines.layout import Layout
from streamer.engines.process import EngineError, free_port, spawn, wait_until
from streamer.engines.state import EngineState

JVM_OPTS = ["-Xmx384m", "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]

LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.apache.name = org.apache.kafka
logger.apache.level = {level}
"""


def broker_properties(port: int, controller_port: int, log_dirs: Path) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(log_dirs),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.cleaner.dedupe.buffer.size": "16777216",
        "message.max.bytes": str(16 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def java_command(classpath: Path, main: str, *args: str, log4j: Path, opts: list[str] | None = None) -> list[str]:
    java = jars.require_java()
    return [
        str(java.executable),
        *(opts or JVM_OPTS),
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        f"{classpath}/*",
        main,
        *args,
    ]


def start(layout: Layout, *, port: int | None = None, controller_port: int | None = None) -> EngineState:
    classpath = jars.resolve(layout, "kafka-pom.xml")
    base = layout.run_dir / "kafka"
    data = base / "data"
    base.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    controller_port = controller_port or free_port()
    props = base / "server.properties"
    props.write_text(broker_properties(port, controller_port, data))
    log4j = base / "log4j2.properties"
    log4j.write_text(LOG4J2.format(level="INFO"))
    log = layout.log_dir / "kafka.log"
    if not (data / "meta.properties").exists():
        # A cluster id may start with "-": passed as --cluster-id=<id> so the CLI never takes it for an option.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        args = ("format", f"--cluster-id={cluster_id}", "-c", str(props))
        opts = ["-Xmx256m", "-XX:+UseSerialGC"]
        fmt = java_command(classpath, "kafka.tools.StorageTool", *args, log4j=log4j, opts=opts)
        result = subprocess.run(fmt, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise EngineError(f"formatting Kafka storage failed:\n{result.stdout}\n{result.stderr}")
    pid = spawn(java_command(classpath, "kafka.Kafka", str(props), log4j=log4j), log=log)
    extra = {"controller_port": controller_port, "java": jars.require_java().describe()}
    state = EngineState("kafka", pid, port, str(data), str(log), extra)
    wait_until(lambda: healthy(state), what="Kafka", timeout_s=120, pid=pid, log=log)
    return state


def bootstrap(state: EngineState) -> str:
    return f"127.0.0.1:{state.port}"


def healthy(state: EngineState) -> bool:
    # A thread of its own, so that the probe also works when called from inside a running event loop.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _metadata_ok(bootstrap(state))).result()


async def _metadata_ok(servers: str) -> bool:
    # aiokafka logs every refused connection at ERROR; while polling for readiness those are expected.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    client = AIOKafkaClient(bootstrap_servers=servers, request_timeout_ms=3000, connections_max_idle_ms=5000)
    try:
        await client.bootstrap()
        return bool(client.cluster.brokers())
    except (KafkaError, OSError):
        return False
    finally:
        await client.close()
