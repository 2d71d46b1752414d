"""The consumer loop that drives one stage: poll, process, write, produce, commit — in that order.

Commit order (at-least-once input, idempotent output, hence effectively-once results):

1. ``getmany()`` a batch (bounded by ``max_poll_records`` and ``fetch_max_bytes``);
2. the stage turns it into graph rows, messages to produce and pins to release (synchronous, no I/O);
3. the graph rows are redacted (``[redaction]``) and written (retried while FalkorDB is unreachable: consumption
   pauses meanwhile);
4. every message is produced and acknowledged (idempotent producer, ``acks=all``);
5. the events the processors emitted are claimed on the graph (one statement: a replay re-derives events already
   recorded and stops here; of two instances deriving one event during a rebalance, one claims it and the other
   waits until it is recorded), redacted (``[redaction]``), published (acknowledged), then recorded;
6. the stage releases the pins of what is now durable, and the offsets it allows are committed.

A crash anywhere replays from the last commit; MERGE on stable keys makes the replay change nothing. A broker
outage pauses the loop where it is: a send waits for the broker (the Kafka sink retries it until a stop request), a
failed poll or commit is tried again after a jittered backoff; nothing is committed past what is durable.
Partition revocation takes the same lock, so it happens between batches, and commits what is safe first.

An exception that escapes the loop (the stage contains everything about its input, so this is an engine error its
sink gave up on, or a bug) ends the runner: it is reported at once, with its traceback, to ``on_failure`` (the
daemon fails its health checks and stops), before the runner settles what is durable, commits it and leaves the
group. The daemon never keeps running with a dead stage.

Batches are pipelined one deep: while batch N is written (steps 3-4, mostly FalkorDB's own CPU), batch N+1 is
processed in a worker thread. N is settled (its pins released, offsets committed) before N+1 is written, so the
commit order above holds for every batch; only the stage's CPU work overlaps the previous batch's I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

from processors.api.sink import Backoff
from processors.redaction import Redactor
from sinks.graph import DeadRow, GraphSink, WriteAborted
from sinks.kafka import KafkaSink, Message, ProduceAborted
from sinks.kafka.client import client_kwargs
from streamer.config import CoreSettings
from streamer.decode.errors import DecodeUnavailable
from streamer.decode.registry import Record
from streamer.runtime.consumers import stop_consumer
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import Source
from streamer.runtime.records import StageOutput, new_record

log = structlog.get_logger("trace_repro.runtime")
FETCH_MAX_WAIT_MS = 500  # a caught-up partition's long poll answers at least this often
POSITION_WAIT_S = 0.05  # a position being reset (out of range) is not caught up; never wait long for it
COMMIT_TIMEOUT_S = 5.0  # a commit the broker does not answer (it is away) is given up and made with the next one


class RunnableStage(Protocol):
    def process(self, records: Iterable[Record]) -> StageOutput: ...
    def release(self, sources: Iterable[Source]) -> None: ...
    def committable(self, tp: Hashable, position: int) -> int: ...
    def progress(self, caught_up: Collection[tuple[str, int]]) -> None: ...
    def forget(self, tp: Hashable) -> None: ...
    def assign(self, tps: Iterable[tuple[str, int]]) -> None: ...
    async def sync(self) -> None: ...
    async def prepare(self, records: list[Record]) -> None: ...

    broadcast_topic: str | None
    broadcast_partitions: int

    @property
    def topics_pattern(self) -> str: ...


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, runner: StageRunner) -> None:
        self.runner = runner

    """The runner's part in a rebalance. aiokafka logs and swallows what a listener raises, which would leave the
    stage running on a half-done hand-over: the exception is given to the runner instead, whose loop ends on it."""

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        try:
            await self.runner.revoke(revoked)
        except Exception as exc:
            self.runner.broken(exc)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        try:
            self.runner.stage.assign((t.topic, t.partition) for t in assigned)
            await self.runner.start_positions(assigned)
        except Exception as exc:
            self.runner.broken(exc)
            return
        log.info(
            "partitions.assigned",
            stage=self.runner.name,
            partitions=sorted(f"{t.topic}/{t.partition}" for t in assigned),
        )


class StageRunner:
    """Runs ``stage`` as consumer group ``group_id`` until ``stop`` is set."""

    def __init__(
        self,
        name: str,
        stage: RunnableStage,
        *,
        settings: CoreSettings,
        group_id: str,
        graph: GraphSink,
        producer: KafkaSink,
        metrics: Metrics,
        on_failure: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        self.name = name
        self.on_failure = on_failure  # told at once when an exception ends the loop (before the clean-up)
        self.stage = stage
        self.settings = settings
        self.group_id = group_id
        self.graph = graph
        self.producer = producer
        self.metrics = metrics
        self.redact = Redactor.of(settings.redaction, settings.redaction_key, metrics.telemetry("redaction"))
        self.consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()
        self._positions: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._inflight: tuple[asyncio.Task[None], StageOutput, dict[TopicPartition, int]] | None = None
        self._read_since: dict[TopicPartition, float] = {}  # since when its fetches have been answering (ms)
        self._looked_ms = 0.0  # when _caught_up last looked
        self._broken: Exception | None = None  # what a rebalance callback raised: the loop ends on it
        self._stop = asyncio.Event()  # the daemon's stop request (set by run)
        self.batches = 0
        self._assigned_before = False  # (kafka.auto_offset_reset: see start_positions)

    def _consumer(self) -> AIOKafkaConsumer:
        k = self.settings.kafka
        return AIOKafkaConsumer(
            **client_kwargs(k, self.name),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # (kafka.auto_offset_reset, for a new group only: start_positions)
            max_partition_fetch_bytes=min(k.fetch_max_bytes, k.max_partition_fetch_bytes),
            fetch_max_bytes=k.fetch_max_bytes,
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            metadata_max_age_ms=5000,  # new CDC topics matching the pattern are found within seconds
            session_timeout_ms=30_000,
            max_poll_interval_ms=600_000,
        )

    async def run(self, stop: asyncio.Event) -> None:
        if self.stage.broadcast_topic:
            self.stage.broadcast_partitions = await self.producer.partitions(self.stage.broadcast_topic)
        self._stop = stop
        consumer = self.consumer = self._consumer()
        consumer.subscribe(pattern=self.stage.topics_pattern, listener=_Rebalance(self))
        await consumer.start()
        log.info("stage.started", stage=self.name, group=self.group_id, pattern=self.stage.topics_pattern)
        k, wait_ms = self.settings.kafka, self.settings.poll_timeout_ms
        polls = Backoff(k.retry_backoff_s, k.max_retry_backoff_s)
        try:
            while not stop.is_set():
                try:
                    batch = await consumer.getmany(timeout_ms=wait_ms, max_records=k.max_poll_records)
                except KafkaError as exc:  # the broker away, the group's coordinator moving: poll again
                    await self._poll_failed(exc, polls, stop)
                    continue
                polls.reset()
                if self._broken is not None:
                    raise self._broken
                async with self._lock:
                    await self._handle(batch)
        except (WriteAborted, ProduceAborted, DecodeUnavailable) as exc:
            log.warning("stage.aborted", stage=self.name, reason=str(exc))
        except BaseException as exc:
            if exc is not self._broken and not (isinstance(exc, asyncio.CancelledError) and stop.is_set()):
                self._failed(exc)  # (a cancel after stop is the daemon's bounded shutdown)
            raise
        finally:
            try:
                if self._broken is None:  # (after a broken hand-over, nothing more is committed)
                    async with self._lock:
                        with contextlib.suppress(WriteAborted, ProduceAborted):  # not durable: replayed later
                            await self._settle()
                        await self._commit()
            finally:
                await stop_consumer(consumer, self.name)
                log.info("stage.stopped", stage=self.name, batches=self.batches)

    def broken(self, exc: Exception) -> None:
        """A rebalance callback raised: reported now; the loop ends on it after the current poll."""
        if self._broken is None:
            self._broken = exc
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        """The loop ended on ``exc``: report it now, not after the clean-up (which may wait on the engines)."""
        if self.on_failure is not None:
            self.on_failure(self.name, exc)
        else:
            log.error("stage.failed", stage=self.name, error=type(exc).__name__, exc_info=exc)

    async def _poll_failed(self, exc: KafkaError, backoff: Backoff, stop: asyncio.Event) -> None:
        """A failed ``getmany`` consumed nothing: count it, log it, and poll again after a jittered backoff."""
        self.metrics.telemetry("kafka").count("poll_errors")
        delay = backoff.next()
        log.warning("stage.poll_failed", stage=self.name, error=type(exc).__name__, detail=str(exc)[:200],
                    attempt=backoff.attempt, backoff_s=round(delay, 3))  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)

    async def _handle(self, batch: dict[TopicPartition, list[Any]]) -> None:
        begin = time.perf_counter()
        records: list[Record] = []
        positions = {}
        for tp, messages in batch.items():
            records += [
                new_record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, tuple(m.headers))
                for m in messages
            ]
            if messages:
                positions[tp] = messages[-1].offset + 1
                assert self.consumer is not None
                highwater = self.consumer.highwater(tp)
                if highwater is not None:
                    self.metrics.lag.labels(tp.topic, str(tp.partition)).set(highwater - positions[tp])
        if self._inflight is not None and self._inflight[0].done():
            await self._settle()
        await self.stage.sync()
        await self._prepare(records)
        self.stage.progress(await self._caught_up())
        if self._inflight is None:
            out = self.stage.process(records)
        else:  # overlap this batch's CPU work with the previous batch's writes
            out = await asyncio.to_thread(self.stage.process, records)
            await self._settle()
        # Positions advance only once the batch is durable: a batch that fails half-way is never committed.
        self._inflight = (asyncio.create_task(self._durable(out)), out, positions)
        self.batches += 1
        self.metrics.batch_seconds.labels(self.name).observe(time.perf_counter() - begin)

    async def _prepare(self, records: list[Record]) -> None:
        """What decoding the batch needs from other services (a schema registry), asked again after a jittered
        backoff while they are away: consumption pauses here, nothing of the batch is processed or committed. If the
        daemon stops meanwhile, :class:`DecodeUnavailable` ends the loop (the batch is replayed after restart)."""
        r = self.settings.decode.schema_registry
        backoff = Backoff(r.retry_backoff_s, r.max_retry_backoff_s)
        while True:
            try:
                await self.stage.prepare(records)
                return
            except DecodeUnavailable as exc:
                if self._stop.is_set():
                    raise
                self.metrics.telemetry("decode").count("prepare_retries")
                delay = backoff.next()
                log.warning("stage.decode_unavailable", stage=self.name, detail=str(exc)[:300],
                            attempt=backoff.attempt, backoff_s=round(delay, 3))  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)

    async def _caught_up(self) -> set[tuple[str, int]]:
        """The partitions read to their end: position at the high-water mark of a fetch response younger than
        ``windows.idle_s`` (three long polls at least), in fetches that have been answering for ``idle_s`` at least.
        One with a backlog, not fetched yet since it was assigned, or not fetched for a while (a broker outage) is
        not: event time waits for it instead of calling it idle. After an outage (or anything that held this loop
        longer than that), its silence counts again from when it is read again, so that what was held up elsewhere
        meanwhile (a collector's buffer, Debezium) arrives before event time catches up with the wall clock."""
        consumer = self.consumer
        if consumer is None:
            return set()
        now_ms = time.time() * 1000
        idle_ms = self.settings.windows.idle_s * 1000
        fresh_ms = max(idle_ms, 3 * FETCH_MAX_WAIT_MS)
        if now_ms - self._looked_ms > fresh_ms:  # held: what the fetches saw meanwhile is not known
            self._read_since.clear()
        self._looked_ms = now_ms
        ends = {}
        for tp in consumer.assignment():
            highwater, polled = consumer.highwater(tp), consumer.last_poll_timestamp(tp)
            if highwater is None or polled is None or now_ms - polled > fresh_ms:
                self._read_since.pop(tp, None)
                continue
            if now_ms - self._read_since.setdefault(tp, now_ms) >= idle_ms:
                ends[tp] = highwater
        done = set()
        for tp, highwater in ends.items():
            try:
                position = await asyncio.wait_for(consumer.position(tp), POSITION_WAIT_S)
            except (TimeoutError, IllegalStateError):  # being reset, or revoked meanwhile
                continue
            if position >= highwater:
                done.add((tp.topic, tp.partition))
        return done

    async def _settle(self) -> None:
        """Wait for the in-flight batch to be durable, then release its pins and commit (step 5)."""
        if self._inflight is None:
            return
        task, out, positions = self._inflight
        self._inflight = None
        await task
        self.stage.release(out.release)
        self._positions.update(positions)
        await self._commit()

    async def _durable(self, out: StageOutput) -> None:
        """Steps 3-5: the graph write, every output message produced and acknowledged, the new events published
        and recorded, and the graph rows refused for their content dead-lettered."""
        dead: list[DeadRow] = []
        if len(out.graph):
            self.redact.graph(out.graph)  # the graph's rows hold what the events hold: redacted alike
            started = time.perf_counter()
            written = await self.graph.write_batch(out.graph, dead)
            self.metrics.graph_rows.inc(written)
            self.metrics.graph_write_seconds.observe(time.perf_counter() - started)
        if out.expire_before_ms is not None:
            await self.graph.expire_spans(out.expire_before_ms)
        await self.produce(out.produce)
        if out.events:
            fresh = [self.redact(e) for e in await self.graph.claim(out.events)]  # before anything sees them
            async with self.graph.holding(fresh):
                await self.produce([self.producer.message(e) for e in fresh])
                await self.graph.record(fresh, dead)
            for event in fresh:
                self._published(event)
        if dead:
            self.metrics.dlq.labels(dead[0].reason).inc(len(dead))
            await self.produce([Message(self.settings.kafka.dlq_topic, d.key, d.value, d.headers) for d in dead])

    def _published(self, event: Any) -> None:
        self.metrics.finding(event)
        if event.kind == "incident":
            log.info("incident", fingerprint=event.fingerprint, anomaly=event.anomaly, severity=event.severity,
                     entity=event.entity, summary=event.summary)  # fmt: skip
        else:
            log.info(event.kind, fingerprint=event.fingerprint)

    async def produce(self, messages: list[Message]) -> None:
        for topic, n in Counter(m.topic for m in messages).items():
            self.metrics.published.labels(topic).inc(n)
        await self.producer.send(messages)

    async def _commit(self, only: Iterable[TopicPartition] | None = None) -> None:
        if self.consumer is None:
            return
        wanted = set(only) if only is not None else set(self._positions)
        offsets = {}
        for tp in wanted:
            if tp not in self._positions:
                continue
            offset = self.stage.committable((tp.topic, tp.partition), self._positions[tp])
            if self._committed.get(tp) != offset:
                offsets[tp] = offset
        if not offsets:
            return
        try:
            await asyncio.wait_for(self.consumer.commit(offsets), COMMIT_TIMEOUT_S)
        except (CommitFailedError, IllegalStateError, KafkaError, TimeoutError) as exc:
            self.metrics.telemetry("kafka").count("commit_errors")  # committed with the next batch, or replayed
            log.warning("commit.failed", stage=self.name, error=type(exc).__name__, detail=str(exc)[:200])
            return
        for tp, offset in offsets.items():
            self._committed[tp] = offset
            self.metrics.committed_offset.labels(tp.topic, str(tp.partition)).set(offset)

    async def start_positions(self, assigned: list[TopicPartition]) -> None:
        """``kafka.auto_offset_reset = latest`` is for a new group, on the input stage: at its first assignment, when
        none of the partitions it got has a committed offset, each starts at its end. Any other partition without a
        committed offset starts at its beginning: a topic created since (a new table's Debezium topic), a partition
        added, or a group that is not new, so nothing produced after the group began is skipped."""
        first, self._assigned_before = not self._assigned_before, True
        consumer = self.consumer
        if not first or self.name != "ingest" or self.settings.kafka.auto_offset_reset != "latest" or not assigned:
            return
        assert consumer is not None
        if any([await consumer.committed(tp) is not None for tp in assigned]):
            return
        for tp, end in (await consumer.end_offsets(assigned)).items():
            consumer.seek(tp, end)
        log.info("stage.starts_at_end", stage=self.name, reason="a new group, kafka.auto_offset_reset = latest")

    async def revoke(self, revoked: list[TopicPartition]) -> None:
        async with self._lock:
            await self._settle()
            await self._commit(revoked)
            for tp in revoked:
                self.stage.forget((tp.topic, tp.partition))
                for gauge in (self.metrics.lag, self.metrics.committed_offset):  # no stale series after a rebalance
                    with contextlib.suppress(KeyError):
                        gauge.remove(tp.topic, str(tp.partition))
                self._positions.pop(tp, None)
                self._committed.pop(tp, None)
                self._read_since.pop(tp, None)
        log.info("partitions.revoked", stage=self.name, partitions=sorted(f"{t.topic}/{t.partition}" for t in revoked))
