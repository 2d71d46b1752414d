"""Wire the daemon together and run it until SIGTERM/SIGINT.

Both stages run in this process by default; each is its own consumer group, so at scale they run as separate
deployments (``--stage ingest`` / ``--stage entities``) on as many machines as partitions allow.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiokafka.errors import KafkaError

from processors.contracts import ProofContract
from sinks.falkordb_graph import GraphWriter
from sinks.incidents import IncidentSink
from sinks.kafka import KafkaSink
from streamer import logs
from streamer.config import Settings
from streamer.runtime.http import HttpServer
from streamer.runtime.metrics import Metrics
from streamer.runtime.records import StageOutput
from streamer.runtime.runner import StageRunner
from streamer.runtime.sink_runner import SinkRunner
from streamer.runtime.stage1 import IngestStage
from streamer.runtime.stage2 import EntityStage
from streamer.runtime.topics import create_topics

log = structlog.get_logger("trace_repro")


async def ensure_topics(settings: Settings) -> None:
    """Create the internal and output topics if they do not exist (the internal one with N partitions)."""
    k = settings.kafka
    wanted = {k.accesses_topic: k.accesses_partitions, k.dlq_topic: 1, k.incidents_topic: 1, k.repros_topic: 1,
              k.verdicts_topic: 1}  # fmt: skip
    await create_topics(k.bootstrap, wanted)


class Daemon:
    """The running daemon: graph writer, producer, both stages, HTTP endpoints."""

    def __init__(self, settings: Settings, *, stages: tuple[str, ...] = ("ingest", "entities")) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.stages = stages
        self.stop = asyncio.Event()
        self.writer = GraphWriter(
            settings.falkordb.url,
            settings.graph_name,
            batch_rows=settings.falkordb.batch_rows,
            timeout_ms=settings.falkordb.query_timeout_ms,
            on_retry=lambda op: self.metrics.graph_retries.labels(op).inc(),
            on_rejected=lambda op, n: self.metrics.graph_rejected.labels(op).inc(n),
            stopping=self.stop,
        )
        self.http = HttpServer(settings.http.host, settings.http.port, self.metrics.registry, self._ready)
        self.runners: list[StageRunner] = []
        self._publish: Callable[[str, bytes, bytes], Awaitable[None]] | None = None
        self.incidents: IncidentSink | None = None
        self._started = False

    def _ready(self) -> bool:
        return self._started and self.writer.ready

    def _sink_runners(self) -> list[SinkRunner]:
        """GitLab and file sinks, each its own consumer group on the output topics (enabled by config)."""
        s = self.settings
        topics = [s.kafka.incidents_topic, s.kafka.repros_topic, s.kafka.verdicts_topic]
        runners = []
        g = s.gitlab
        if g.url and s.gitlab_token is not None:
            from sinks.gitlab.sink import GitLabSink

            gitlab = GitLabSink(g.url, g.project, s.gitlab_token, labels=tuple(g.labels), timeout_s=g.timeout_s,
                                max_attempts=g.max_attempts, backoff_s=g.backoff_s, max_backoff_s=g.max_backoff_s,
                                max_retry_after_s=g.max_retry_after_s, occurrence_notes=g.occurrence_notes,
                                merge_requests=g.merge_requests, target_branch=g.target_branch or None,
                                ssl_verify=g.ssl_verify)  # fmt: skip
            runners.append(SinkRunner("gitlab", gitlab, settings=s, topics=topics, metrics=self.metrics))
        elif g.url:
            log.warning("gitlab.disabled", reason="TRACE_REPRO_GITLAB_TOKEN is not set")
        if s.repro.enabled:
            from streamer.runtime.repro_worker import ReproWorker

            assert self._publish is not None
            worker = ReproWorker(s, self.writer, self._publish)
            runners.append(SinkRunner("repro", worker, settings=s, topics=[s.kafka.incidents_topic],
                                      metrics=self.metrics))  # fmt: skip
        f = s.file_sink
        if f.enabled:
            from sinks.files import FileSink

            files = FileSink(Path(f.directory), max_bytes=f.max_bytes, keep=f.keep, remember=f.remember,
                             tail_bytes=f.tail_bytes)  # fmt: skip
            runners.append(SinkRunner("files", files, settings=s, topics=topics, metrics=self.metrics))
        return runners

    async def _stored_contracts(self) -> list[ProofContract]:
        """Contracts already on the graph (automatic ones and CLI ones), so that a restart keeps watching them."""
        rows = await self.writer.query("MATCH (c:Contract) RETURN c.json ORDER BY c.created")
        return [ProofContract.model_validate_json(r[0]) for r in rows if r[0]]

    async def run(self) -> int:
        s = self.settings
        await self.http.start()
        log.info("daemon.starting", kafka=s.kafka.bootstrap, falkordb=s.falkordb.url, graph=s.graph_name,
                 http_port=self.http.port, stages=list(self.stages))  # fmt: skip
        await self.writer.bootstrap()
        await ensure_topics(s)
        producer = KafkaSink(s.kafka.bootstrap, self.metrics)
        await producer.start()
        clock = time.time_ns
        publish = self._publish = producer.publish

        incidents = self.incidents = IncidentSink(self.writer, publish, s.kafka.incidents_topic)

        ingest = IngestStage(s, self.metrics, clock) if "ingest" in self.stages else None
        if ingest is not None:
            for contract in await self._stored_contracts():
                ingest.proofs.inbox.append(contract)

        async def after_entities(out: StageOutput) -> None:
            for event in await incidents.handle(out.incidents):  # stage 1's judge reads them from the topic
                self.metrics.incidents.labels(event.severity, event.anomaly).inc()

        def runner(name: str, stage: IngestStage | EntityStage, group: str) -> StageRunner:
            after = after_entities if name == "entities" else None
            return StageRunner(name, stage, settings=s, group_id=group, writer=self.writer, producer=producer,
                               metrics=self.metrics, after_batch=after)  # fmt: skip

        if ingest is not None:
            self.runners.append(runner("ingest", ingest, s.kafka.group_id))
        if "entities" in self.stages:
            entities = EntityStage(s, self.metrics, clock)
            self.runners.append(runner("entities", entities, f"{s.kafka.group_id}.entities"))
        tasks = [asyncio.create_task(r.run(self.stop), name=r.name) for r in self.runners]
        tasks += [asyncio.create_task(r.run(self.stop), name=f"sink-{r.name}") for r in self._sink_runners()]
        self._started = True
        log.info("daemon.started", http_port=self.http.port)
        try:
            stopped = asyncio.create_task(self.stop.wait())
            await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
            self.stop.set()
            await asyncio.gather(*tasks, return_exceptions=False)
        finally:
            await producer.stop()
            await self.writer.close()
            await self.http.stop()
        log.info("daemon.stopped")
        return 0


async def _main(settings: Settings, stages: tuple[str, ...]) -> int:
    daemon = Daemon(settings, stages=stages)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.stop.set)
    try:
        return await daemon.run()
    except KafkaError as exc:
        log.error("daemon.kafka_error", error=str(exc))
        return 1


def serve(settings: Settings, stages: tuple[str, ...] = ("ingest", "entities")) -> int:
    logs.configure()
    return asyncio.run(_main(settings, stages))
