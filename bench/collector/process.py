"""A running test Collector: the shipped ``config/otel-collector.yaml``, pointed at a test's Kafka and topics.

:func:`collector_config` takes the configuration users are told to run and changes only addresses: the OTLP
receiver's gRPC and HTTP endpoints and the ``health_check`` endpoint on free ports of 127.0.0.1, the kafka
exporter's ``brokers`` and its ``traces``/``logs`` topics, and the Collector's own metrics turned off (their
default port would clash between two Collectors). Every other key (batch processor, ``otlp_proto``,
``partition_traces_by_id``, protocol version, compression) is the shipped one, so a key the pinned release refuses
fails here first.

:func:`start` runs the binary on that file, logging to ``collector.log`` beside it, and returns once the health
check answers (the pipelines are built and the receivers listen). :meth:`Collector.stop` sends SIGTERM: the
Collector flushes the batch processor and the exporter's queue to Kafka before it exits.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from streamer.engines import Layout
from streamer.engines.process import EngineError, alive, free_port, spawn, stop, wait_until

START_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Ports:
    grpc: int
    http: int
    health: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


def shipped_config() -> dict[str, Any]:
    """``config/otel-collector.yaml`` as users get it."""
    loaded: dict[str, Any] = yaml.safe_load((Layout.default().config_dir / "otel-collector.yaml").read_text())
    return loaded


def collector_config(kafka_bootstrap: str, spans_topic: str, logs_topic: str, ports: Ports) -> dict[str, Any]:
    """The shipped configuration with this run's addresses and topics (see the module docstring)."""
    cfg = shipped_config()
    protocols = cfg["receivers"]["otlp"]["protocols"]
    protocols["grpc"]["endpoint"] = f"127.0.0.1:{ports.grpc}"
    protocols["http"]["endpoint"] = f"127.0.0.1:{ports.http}"
    cfg["extensions"]["health_check"]["endpoint"] = f"127.0.0.1:{ports.health}"
    kafka = cfg["exporters"]["kafka"]
    kafka["brokers"] = kafka_bootstrap.split(",")
    kafka["traces"]["topic"] = spans_topic
    kafka["logs"]["topic"] = logs_topic
    cfg["service"].setdefault("telemetry", {})["metrics"] = {"level": "none"}
    return cfg


@dataclass
class Collector:
    """One Collector process; ``http_endpoint`` is the OTLP/HTTP base URL (``/v1/traces`` is appended by SDKs)."""

    pid: int
    ports: Ports
    config: Path
    log: Path

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    @property
    def grpc_endpoint(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def traces_url(self) -> str:
        return f"{self.http_endpoint}/v1/traces"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports.health}/", timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        return alive(self.pid)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM (the Collector drains its batches and queue to Kafka), then SIGKILL after ``grace_s``."""
        stop(self.pid, grace_s=grace_s)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "".join(text.splitlines(keepends=True)[-lines:])


StartCollector = Callable[[str], Collector]
"""What the tests' ``otel_collector`` fixture gives: start a Collector writing spans to the topic given."""


def start(binary: Path, *, kafka_bootstrap: str, spans_topic: str, logs_topic: str, work_dir: Path) -> Collector:
    """A Collector on free ports writing to ``spans_topic``/``logs_topic``, ready (its health check answers)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ports = Ports.free()
    config = work_dir / "otel-collector.yaml"
    config.write_text(yaml.safe_dump(collector_config(kafka_bootstrap, spans_topic, logs_topic, ports)))
    log = work_dir / "collector.log"
    pid = spawn([str(binary), f"--config={config}"], log=log, cwd=work_dir)
    collector = Collector(pid, ports, config, log)
    try:
        wait_until(collector.healthy, what="the Collector", timeout_s=START_TIMEOUT_S, pid=pid, log=log)
    except EngineError:
        collector.stop(grace_s=5)
        raise
    return collector
