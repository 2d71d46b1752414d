"""The daemon: built from the components list, run until SIGTERM/SIGINT.

Both stages run in this process by default; each is its own consumer group, so at scale they run as separate
deployments (``--stage ingest`` / ``--stage entities``) on as many machines as partitions allow. Every detector
and stage connector runs in the stage its factory names; every sink and sink-shaped connector consumes the output
topics its factory names as a consumer group of its own (a slow GitLab never holds detection back). The graph
and Kafka sinks are the runtime's own. ``/readyz`` reflects every sink's health, checked in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

import structlog
from aiokafka.errors import KafkaError

from processors.component import Processor
from processors.model.outputs import register
from processors.sink import Sink
from sinks.graph import GraphSink, GraphWriter
from sinks.kafka import KafkaSink
from streamer import logs
from streamer.components import Components, default
from streamer.config import CoreSettings
from streamer.runtime.context import RuntimeContext, create, stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.http import HttpServer
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.runner import StageRunner
from streamer.runtime.sink_runner import SinkRunner
from streamer.runtime.topics import create_topics

log = structlog.get_logger("trace_repro")
HEALTH_EVERY_S = 10.0


async def ensure_topics(settings: CoreSettings) -> None:
    """Create the internal and output topics if they do not exist (the internal one with N partitions)."""
    k = settings.kafka
    wanted = {k.accesses_topic: k.accesses_partitions, k.dlq_topic: 1, k.incidents_topic: 1, k.repros_topic: 1,
              k.verdicts_topic: 1}  # fmt: skip
    await create_topics(k.bootstrap, wanted)


class Daemon:
    """The running daemon: graph and Kafka sinks, the stages with their processors, the sinks, HTTP endpoints."""

    def __init__(self, settings: CoreSettings, *, stages: tuple[str, ...] = ("ingest", "entities"),
                 components: Components | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.components = components or default()
        for factory in self.components.factories:
            register(*factory.events)
        self.metrics = Metrics()
        self.stages = stages
        self.stop = asyncio.Event()
        f = settings.falkordb
        writer = GraphWriter(f.endpoint(), settings.graph_name, batch_rows=f.batch_rows, timeout_ms=f.query_timeout_ms,
                             on_retry=lambda op: self.metrics.graph_retries.labels(op).inc(),
                             on_rejected=lambda op, n: self.metrics.graph_rejected.labels(op).inc(n),
                             stopping=self.stop)  # fmt: skip
        self.graph = GraphSink(writer, clock_ms=lambda: time.time() * 1000, telemetry=self.metrics.telemetry("graph"),
                               retention=settings.graph_policy)  # fmt: skip
        self.producer = KafkaSink(settings.kafka, telemetry=self.metrics.telemetry("kafka"), stopping=self.stop)
        self.http = HttpServer(settings.http.host, settings.http.port, self.metrics.registry, self._readiness)
        self.runners: list[StageRunner] = []
        self.sink_runners: list[SinkRunner] = []
        self.ingest: IngestStage | None = None
        self.entities: EntityStage | None = None
        self.started = False
        self._health: dict[str, bool] = {}
        self._healthy = self.metrics.sink_healthy

    # ---- building ---------------------------------------------------------------------------------------------

    def _stage_processors(self, stage: str, tracker: PinTracker) -> list[tuple[Processor, tuple[str, ...]]]:
        return stage_processors(self.settings, self.metrics, time.time_ns, stage, tracker, self.components.factories,
                                graph=self.graph)  # fmt: skip

    def _build(self) -> None:
        s, clock = self.settings, time.time_ns
        if "ingest" in self.stages:
            tracker = PinTracker()
            self.ingest = IngestStage(s, self.metrics, clock, tracker=tracker, graph=self.graph,
                                      processors=self._stage_processors("ingest", tracker))  # fmt: skip
            self.runners.append(self._runner(self.ingest, s.kafka.group_id))
        if "entities" in self.stages:
            tracker = PinTracker()
            self.entities = EntityStage(s, self.metrics, clock, tracker=tracker,
                                        processors=self._stage_processors("entities", tracker))  # fmt: skip
            self.runners.append(self._runner(self.entities, f"{s.kafka.group_id}.entities"))
        for factory in self.components.factories:
            if factory.stage or not factory.topics or factory.kind not in ("sink", "connector"):
                continue
            ctx = RuntimeContext(s, self.metrics, clock, graph=self.graph, publish=self.producer.publish)
            sink = create(factory, ctx, s)
            if sink is not None:
                topics = [s.kafka.topic(role) for role in factory.topics]
                self.sink_runners.append(SinkRunner(factory.name, sink, settings=s, topics=topics,
                                                    metrics=self.metrics))  # fmt: skip

    def _runner(self, stage: IngestStage | EntityStage, group: str) -> StageRunner:
        return StageRunner(stage.name, stage, settings=self.settings, group_id=group, graph=self.graph,
                           producer=self.producer, metrics=self.metrics)  # fmt: skip

    # ---- health -----------------------------------------------------------------------------------------------

    def sinks(self) -> list[Sink]:
        return [self.graph, self.producer, *(r.sink for r in self.sink_runners)]

    async def check_health(self) -> dict[str, bool]:
        """Every sink's health check now (each bounded to 5 s); updates ``/readyz`` and the gauge."""
        for sink in self.sinks():
            try:
                ok = await asyncio.wait_for(sink.healthcheck(), 5.0)
            except Exception:
                ok = False
            self._health[sink.name] = ok
            self._healthy.labels(sink.name).set(1 if ok else 0)
        return dict(self._health)

    def _readiness(self) -> tuple[bool, str]:
        if not self.started:
            return False, "starting"
        failing = sorted(name for name, ok in self._health.items() if not ok)
        return (not failing, "unhealthy sinks: " + ", ".join(failing))

    async def _health_loop(self) -> None:
        while not self.stop.is_set():
            await self.check_health()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), HEALTH_EVERY_S)

    # ---- running ----------------------------------------------------------------------------------------------

    async def run(self) -> int:
        s = self.settings
        await self.http.start()
        log.info("daemon.starting", kafka=s.kafka.bootstrap, falkordb=s.falkordb.redacted_url, graph=s.graph_name,
                 http_port=self.http.port, stages=list(self.stages))  # fmt: skip
        await self.graph.start()
        await ensure_topics(s)
        await self.producer.start()
        try:
            self._build()
            if self.ingest is not None:
                for contract in await self.graph.stored_contracts():  # a restart keeps watching them
                    self.ingest.on_event(contract)
            tasks = [asyncio.create_task(r.run(self.stop), name=r.name) for r in self.runners]
            tasks += [asyncio.create_task(r.run(self.stop), name=f"sink-{r.name}") for r in self.sink_runners]
            tasks.append(asyncio.create_task(self._health_loop(), name="health"))
            await self.check_health()
            self.started = True
            log.info("daemon.started", http_port=self.http.port,
                     components=[f.name for f in self.components.factories])  # fmt: skip
            stopped = asyncio.create_task(self.stop.wait())
            await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=False)
        finally:
            await self.producer.close()
            await self.graph.close()
            await self.http.stop()
        log.info("daemon.stopped")
        return 0


async def _main(settings: CoreSettings, stages: tuple[str, ...], components: Components | None) -> int:
    daemon = Daemon(settings, stages=stages, components=components)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop.set)
    try:
        return await daemon.run()
    except KafkaError as exc:
        log.error("daemon.kafka_error", error=str(exc))
        return 1


def serve(settings: CoreSettings, stages: tuple[str, ...] = ("ingest", "entities"),
          components: Components | None = None) -> int:  # fmt: skip
    logs.configure()
    return asyncio.run(_main(settings, stages, components))
