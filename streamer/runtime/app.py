"""The daemon: built from the components list, run until SIGTERM/SIGINT.

Both stages run in this process by default; each is its own consumer group, so at scale they run as separate
deployments (``--stage ingest`` / ``--stage entities``) on as many machines as partitions allow. Every detector
and stage connector runs in the stage its factory names; every sink and sink-shaped connector consumes the output
topics its factory names as a consumer group of its own (a slow GitLab never holds detection back). The graph
and Kafka sinks are the runtime's own. ``/readyz`` reflects every sink's health, checked in the background.

No dead stage in a live process. Each stage runner, sink runner and the health loop runs as a supervised task: one
that raises, is cancelled, or ends while the daemon should be running is a failure, logged at once with its
traceback (``stage.failed``, ``sink.failed``); ``/healthz`` and ``/readyz`` then answer 503 saying what failed, and
the daemon stops: the other tasks get ``STOP_GRACE_S`` to finish their batch, commit and leave their groups, then
are cancelled and given ``CANCEL_GRACE_S`` more; whatever still runs after that (a client stuck on an engine) is
left behind, and the process exits with status 1 (:func:`run_daemon` does not wait for it). A restart then replays
from the committed offsets; restarting is the orchestrator's (or, with ``--workers``, the supervisor's) job, with
its backoff and its count, never a stage restarted in place on state the failure left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Awaitable, Coroutine
from typing import Any

import structlog
from aiokafka.errors import KafkaError

from processors.api.component import Processor
from processors.api.sink import Sink
from processors.model.outputs import Published, register
from processors.redaction import Redactor
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
from streamer.runtime.topics import MissingTopics, ensure_topics

log = structlog.get_logger("trace_repro")
HEALTH_EVERY_S = 10.0
STOP_GRACE_S = 10.0  # after a failure: how long the other tasks have to finish their batch, commit and leave
CANCEL_GRACE_S = 5.0  # then they are cancelled, and given this long to unwind; what still runs is left behind
CLOSE_S = 10.0  # each of the producer's and the graph's close, at the end


class Daemon:
    """The running daemon: graph and Kafka sinks, the stages with their processors, the sinks, HTTP endpoints."""

    def __init__(self, settings: CoreSettings, *, stages: tuple[str, ...] = ("ingest", "entities"),
                 components: Components | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.components = components or default()
        for factory in self.components.factories:
            register(*factory.events)
        self.metrics = Metrics(max_service_labels=settings.http.max_service_labels)
        self.stages = stages
        self.stop = asyncio.Event()
        f = settings.falkordb
        writer = GraphWriter(f.endpoint(), settings.graph_name, batch_rows=f.batch_rows, timeout_ms=f.query_timeout_ms,
                             on_retry=lambda op: self.metrics.graph_retries.labels(op).inc(),
                             on_rejected=lambda op, n: self.metrics.graph_rejected.labels(op).inc(n),
                             stopping=self.stop)  # fmt: skip
        self.graph = GraphSink(writer, clock_ms=lambda: time.time() * 1000, telemetry=self.metrics.telemetry("graph"),
                               retention=settings.graph_policy, lease_s=f.publish_lease_s)  # fmt: skip
        self.producer = KafkaSink(settings.kafka, telemetry=self.metrics.telemetry("kafka"), stopping=self.stop)
        self.redact = Redactor.of(settings.redaction, settings.redaction_key, self.metrics.telemetry("redaction"))
        self.http = HttpServer(settings.http.host, settings.http.port, self.metrics.registry, self._readiness,
                               self._liveness)  # fmt: skip
        self.failure = ""  # what failed first ("stage ingest: ValueError"): the daemon stops and exits 1
        self._failed_tasks: set[str] = set()
        self._failed = asyncio.Event()
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
            ctx = RuntimeContext(s, self.metrics, clock, graph=self.graph, publish=self._publish)
            sink = create(factory, ctx, s)
            if sink is not None:
                topics = [s.kafka.topic(role) for role in factory.topics]
                self.sink_runners.append(SinkRunner(factory.name, sink, settings=s, topics=topics,
                                                    metrics=self.metrics))  # fmt: skip

    async def _publish(self, event: Published) -> None:
        """What connectors publish (repros), redacted like the stages' events (``StageRunner._durable``)."""
        await self.producer.publish(self.redact(event))

    def _runner(self, stage: IngestStage | EntityStage, group: str) -> StageRunner:
        return StageRunner(stage.name, stage, settings=self.settings, group_id=group, graph=self.graph,
                           producer=self.producer, metrics=self.metrics,
                           on_failure=lambda name, exc: self.fail(f"stage {name}", exc))  # fmt: skip

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

    def _liveness(self) -> tuple[bool, str]:
        return (False, f"failed: {self.failure}") if self.failure else (True, "")

    def _readiness(self) -> tuple[bool, str]:
        if self.failure:
            return False, f"failed: {self.failure}"
        if not self.started:
            return False, "starting"
        failing = sorted(name for name, ok in self._health.items() if not ok)
        return (not failing, "unhealthy sinks: " + ", ".join(failing))

    async def _health_loop(self) -> None:
        while not self.stop.is_set():
            await self.check_health()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), HEALTH_EVERY_S)

    # ---- failures ---------------------------------------------------------------------------------------------

    def fail(self, task: str, exc: BaseException | None, why: str = "") -> None:
        """``task`` ("stage ingest", "sink gitlab") failed: logged now with its traceback (once per task), the
        health checks fail, and the daemon stops (exit status 1)."""
        if task in self._failed_tasks:
            return
        self._failed_tasks.add(task)
        if not why:
            why = "cancelled" if isinstance(exc, asyncio.CancelledError) else type(exc).__name__ if exc else "failed"
        self.failure = self.failure or f"{task}: {why}"
        event = f"{task.split(' ', 1)[0]}.failed" if task.startswith(("stage ", "sink ")) else "task.failed"
        log.error(event, task=task, error=why, detail=str(exc)[:300] if exc is not None else "",
                  exc_info=exc if isinstance(exc, BaseException) else None)  # fmt: skip
        self.stop.set()
        self._failed.set()

    async def _supervised(self, task: str, work: Awaitable[None]) -> None:
        """Run ``work``; raising, being cancelled or returning while the daemon should run is a failure."""
        try:
            await work
        except asyncio.CancelledError as exc:
            if not self.stop.is_set():
                self.fail(task, exc, "cancelled")
            raise
        except Exception as exc:
            self.fail(task, exc)
        else:
            if not self.stop.is_set():
                self.fail(task, None, "ended while the daemon was running")

    async def _wind_down(self, tasks: list[asyncio.Task[None]]) -> None:
        """After ``stop``: every task finishes its batch and commits. Once something failed, they get
        ``STOP_GRACE_S``, then are cancelled and get ``CANCEL_GRACE_S``; what still runs is named and left."""
        if not tasks:
            return
        everything: asyncio.Future[list[Any]] = asyncio.gather(*tasks, return_exceptions=True)
        failed: asyncio.Future[Any] = asyncio.ensure_future(self._failed.wait())
        await asyncio.wait([everything, failed], return_when=asyncio.FIRST_COMPLETED)
        failed.cancel()
        if not everything.done():
            await asyncio.wait([everything], timeout=STOP_GRACE_S)
        if not everything.done():
            for task in tasks:
                task.cancel()
            await asyncio.wait([everything], timeout=CANCEL_GRACE_S)
        if not everything.done():
            log.error("daemon.abandoned", tasks=sorted(t.get_name() for t in tasks if not t.done()),
                      reason=f"still running {STOP_GRACE_S + CANCEL_GRACE_S:g} s after the failure")  # fmt: skip

    # ---- running ----------------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run until stopped; the exit status: 0, or 1 when a stage, a sink runner or the health loop failed."""
        s = self.settings
        await self.http.start()
        log.info("daemon.starting", kafka=s.kafka.bootstrap, falkordb=s.falkordb.redacted_url, graph=s.graph_name,
                 http_port=self.http.port, stages=list(self.stages))  # fmt: skip
        await self.graph.start()
        await ensure_topics(s.kafka)  # (or MissingTopics, with create_topics = false)
        await self.producer.start()
        try:
            self._build()
            if self.ingest is not None:
                for contract in await self.graph.stored_contracts():  # a restart keeps watching them
                    self.ingest.on_event(contract)
            tasks = [self._task(f"stage {r.name}", r.run(self.stop), r.name) for r in self.runners]
            tasks += [self._task(f"sink {r.name}", r.run(self.stop), f"sink-{r.name}") for r in self.sink_runners]
            tasks.append(self._task("health checks", self._health_loop(), "health"))
            await self.check_health()
            self.started = True
            log.info("daemon.started", http_port=self.http.port,
                     components=[f.name for f in self.components.factories])  # fmt: skip
            await self.stop.wait()
            await self._wind_down(tasks)
        finally:
            for what, closing in (("kafka", self.producer.close()), ("graph", self.graph.close())):
                try:
                    await asyncio.wait_for(closing, CLOSE_S)
                except Exception as exc:  # stopping anyway: said, not raised over what stopped the daemon
                    log.warning("daemon.close_failed", sink=what, error=type(exc).__name__)
            await self.http.stop()
        if self.failure:
            log.error("daemon.failed", reason=self.failure, exit_code=1)
            return 1
        log.info("daemon.stopped")
        return 0

    def _task(self, task: str, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return asyncio.create_task(self._supervised(task, work), name=name)


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
    except MissingTopics as exc:
        log.error("daemon.missing_topics", error=str(exc))
        return 2


def run_daemon(main: Coroutine[Any, Any, int]) -> int:
    """``asyncio.run(main)``, but what ``main`` leaves running (a task stuck on an engine after the daemon gave up
    on it) is cancelled and given ``CANCEL_GRACE_S``, then left behind: the process exits with ``main``'s status
    instead of waiting on it (``asyncio.run`` would wait for every task it cancels, for as long as they take)."""
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            left = asyncio.all_tasks(loop)
            for task in left:
                task.cancel()
            if left:
                _, stuck = loop.run_until_complete(asyncio.wait(left, timeout=CANCEL_GRACE_S))
                if stuck:
                    log.error("daemon.abandoned", tasks=sorted(t.get_name() for t in stuck))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def serve(settings: CoreSettings, stages: tuple[str, ...] = ("ingest", "entities"),
          components: Components | None = None) -> int:  # fmt: skip
    logs.configure(settings.log_level)
    return run_daemon(_main(settings, stages, components))
