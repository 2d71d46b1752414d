"""The Kafka sink: every message the daemon produces (output events, dead letters, the internal topic).

One idempotent producer (``enable_idempotence``, ``acks=all``) per daemon, so a retried send is never written twice.
Output events are keyed by fingerprint, so all of one defect's events stay in order on one partition, and go to
the topic of their role (``Published.topic``: incidents, repros, verdicts, contracts). ``send`` queues a batch and
returns once every message is acknowledged: the runtime commits offsets only after that.

**Broker outages.** ``send`` waits for the broker as long as it takes. A record batch that cannot be queued yet (the
previous batch of its partition still waits for the broker: ``KafkaTimeoutError``) is queued again; one that the
producer gave up (a request timeout, not enough replicas, no leader after the broker's restart, ...) is sent again,
after a jittered exponential backoff (``kafka.retry_backoff_s`` doubling up to ``kafka.max_retry_backoff_s``),
counted (``trace_repro_component_events_total{component="kafka", event="retries"}``) and logged. Only the batches
that failed are sent again, each message in its order, so nothing acknowledged is written twice. Any batch that
failed left a gap in the producer's sequence numbers for its partition (the broker would refuse every later batch
there as out of order), so those are sent by a new producer (``renewals``); the old one finishes what other callers
still have under way, then stops. The caller (the stage runner) waits meanwhile: its consumption pauses and its
offsets stay uncommitted, and the health check fails while a send waits. Only a stop request ends the wait, with
:class:`ProduceAborted` (after :data:`STOP_GRACE_S` for what is under way): the input is replayed after the restart.

**Message sizes.** The broker refuses a record batch larger than its topic's ``max.message.bytes``; the sink learns
each topic's limit (:class:`~sinks.kafka.sizing.Limits`: at start for the daemon's topics, on first use for any
other), builds no batch beyond it, and fits every message to it before sending. A dead letter too large is trimmed
(its value cut to fit, with a ``truncated`` header holding the original size and ``original.sha256``; counted
``trimmed``). Any other message too large (an incident, a repro, a verdict, an internal record) is dead-lettered
instead, trimmed in the same way, with reason ``too_large``, and counted (``trace_repro_dropped_total{component=
"kafka", reason="too_large"}``). A size refusal the sink did not foresee (a limit lowered since it was read) makes it
read the limit again and fit again. A message too large never stops the daemon.

**Refused records.** A batch the broker refuses for its records (too large, ``CorruptRecordException``,
``InvalidTimestampError``) is sent again one message per batch, to find the one; a message refused for its content
is dead-lettered (reason ``refused:<error>``), a dead letter refused is dropped; both counted (``dropped{component=
"kafka", reason="refused:<error>"}``). Every other error is the broker's, not the message's: retried as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, TypeVar

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    RecordListTooLargeError,
)
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch

from processors.api.sink import Backoff, Sink
from processors.api.telemetry import Telemetry
from processors.model.base import Published
from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig
from sinks.kafka.message import Message
from sinks.kafka.sizing import Fitter, Limits, message_size

log = structlog.get_logger("trace_repro.kafka")
T = TypeVar("T")

_PARTITIONER = DefaultPartitioner()
# A record batch's size (aiokafka's max_batch_size), unless its topic takes less. aiokafka queues one batch per
# partition and has one produce request in flight per broker, so each batch more on a partition is one more round
# trip of the send: a stage batch's packed accesses (up to ``accesses_message_bytes``) and the watermark behind
# them go in one batch (at 16 KiB, aiokafka's default, two or three round trips a send: bench/RESULTS.md).
BATCH_BYTES = 512 * 1024
STOP_GRACE_S = 5.0  # when the daemon stops, what is under way may complete within this
STALL_S = 15.0  # a send waiting this long for acknowledgements counts as stalled (health check, a log line)
SIZE_ERRORS = (MessageSizeTooLargeError, RecordListTooLargeError)
REFUSALS = (*SIZE_ERRORS, CorruptRecordException, InvalidTimestampError)  # about the records, not the broker
CODECS = {
    None: 0,
    "gzip": DefaultRecordBatch.CODEC_GZIP,
    "snappy": DefaultRecordBatch.CODEC_SNAPPY,
    "lz4": DefaultRecordBatch.CODEC_LZ4,
    "zstd": DefaultRecordBatch.CODEC_ZSTD,
}  # (kafka.compression_type)
Failed = list[tuple[list[Message], BaseException]]  # the messages of each batch that failed, with its error


class ProduceAborted(RuntimeError):
    """The daemon is stopping while the broker cannot take a send: give up; the input is replayed after restart."""


def _append(batch: BatchBuilder, m: Message) -> bool:
    """Add ``m`` to a record batch; False when the batch is full."""
    return batch.append(key=m.key, value=m.value, timestamp=None, headers=list(m.headers)) is not None


class KafkaSink(Sink):
    """See the module docstring; ``write`` publishes at once and ``flush`` has nothing left to do."""

    name = "kafka"

    def __init__(self, config: KafkaConfig, *, telemetry: Telemetry | None = None, linger_ms: int = 5,
                 max_request_size: int = 16 * 1024 * 1024, stopping: asyncio.Event | None = None,
                 rng: random.Random | None = None) -> None:  # fmt: skip
        self.config = config
        self.telemetry = (telemetry or Telemetry("kafka")).declare("too_large", "dead_letter_too_large")
        self.limits = Limits(config, max_request_size)
        self.fitter = Fitter(self.limits, config.dlq_topic, self.telemetry)
        self._linger_ms, self._max_request_size = linger_ms, max_request_size
        self._codec = None if config.compression_type == "none" else config.compression_type
        self._stopping = stopping
        self._rng = rng or random.Random()
        self._producer = self._new_producer()
        self._generation = 0  # which producer: a send that failed renews only the one it used
        self._renewing = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()  # old producers finishing what is under way
        self._stalled = 0  # sends waiting for the broker right now
        self._started = False

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(**client_kwargs(self.config, "producer"), enable_idempotence=True, acks="all",
                                linger_ms=self._linger_ms, max_request_size=self._max_request_size,
                                max_batch_size=BATCH_BYTES, compression_type=self._codec)  # fmt: skip

    async def start(self) -> None:
        await self._producer.start()
        self._started = True
        c = self.config
        await self.limits.learn([c.accesses_topic, c.dlq_topic, c.incidents_topic, c.repros_topic, c.verdicts_topic,
                                 c.contracts_topic])  # fmt: skip

    async def close(self) -> None:
        if self._started:
            self._started = False
            for task in list(self._retiring):
                task.cancel()
            for producer in [self._producer, *(getattr(t, "producer", None) for t in self._retiring)]:
                if producer is not None:
                    await _stop(producer)

    # ---- sending ----------------------------------------------------------------------------------------------

    async def send(self, messages: Iterable[Message]) -> None:
        """Produce every message and wait until all are acknowledged (however long the broker is away; see the
        module docstring), or raise :class:`ProduceAborted` when the daemon stops first.

        Messages are appended to one record batch per partition at a time and each full batch is submitted whole,
        so a batch of messages costs one future per record batch rather than one ``send`` per message (one ``send`` per
        access was a large part of stage 1's write path). A keyed message goes to the partition the
        producer's default partitioner would choose (murmur2 of its key), so the messages of one key keep their
        order on its partition, as do messages placed on a partition; one without key or partition goes to a
        partition chosen at random.
        """
        pending = await self.fitter.fitted(messages)
        alone: set[Message] = set()  # messages of a batch the broker refused: sent one per batch to find the culprit
        backoff = Backoff(self.config.retry_backoff_s, self.config.max_retry_backoff_s, self._rng)
        for topic, n in Counter(m.topic for m in pending).items():
            self.telemetry.count(topic, n)
        while pending:
            generation = self._generation
            failed = await self._attempt(self._producer, pending, alone)
            if not failed:
                break
            pending = []
            retryable: BaseException | None = None
            for batch, exc in failed:
                if isinstance(exc, REFUSALS) and len(batch) > 1:
                    alone.update(batch)
                    pending += batch
                elif isinstance(exc, SIZE_ERRORS):
                    await self.limits.refused(batch[0].topic, message_size(batch[0]))
                    pending += await self.fitter.fitted(batch)
                elif isinstance(exc, REFUSALS):
                    pending += await self.fitter.fitted(self.fitter.refused(batch[0], exc))
                else:
                    pending += batch
                    if not isinstance(exc, OutOfOrderSequenceNumber):  # (a gap an earlier failure left: see below)
                        retryable = exc
            await self._renew(generation)
            if retryable is not None:
                await self._pause(retryable, backoff)
        if backoff.attempt:
            log.info("kafka.recovered", attempts=backoff.attempt)

    async def _attempt(self, producer: AIOKafkaProducer, messages: Sequence[Message], alone: set[Message]) -> Failed:
        """Queue ``messages`` in record batches (those in ``alone`` one per batch) and wait for every
        acknowledgement; returns the batches that failed (a partition whose batch could not be queued sends nothing
        more in this attempt: its later messages fail with it)."""
        queued: list[tuple[asyncio.Future[Any] | BaseException, list[Message]]] = []
        building: dict[tuple[str, int], tuple[BatchBuilder, list[Message]]] = {}
        broken: set[tuple[str, int]] = set()
        partitions: dict[str, list[int]] = {}

        async def submit(where: tuple[str, int], batch: BatchBuilder, batch_messages: list[Message]) -> None:
            if where in broken:
                queued.append((KafkaTimeoutError("an earlier batch of its partition failed"), batch_messages))
                return
            try:
                queued.append((await self._enqueue(producer, batch, *where), batch_messages))
            except KafkaError as exc:
                broken.add(where)
                queued.append((exc, batch_messages))

        for m in messages:
            partition = m.partition
            if partition is None:
                if m.topic not in partitions:
                    partitions[m.topic] = sorted(await self._partitions_for(producer, m.topic))
                every = partitions[m.topic]
                partition = _PARTITIONER(m.key, every, None if m.key is not None else every)
            where = (m.topic, partition)
            entry = building.get(where)
            if entry is not None and (m in alone or not _append(entry[0], m)):
                await submit(where, *building.pop(where))  # full (or m goes alone): the next batch starts
                entry = None
            if entry is None:
                entry = building[where] = (self._batch(m.topic), [])
                _append(entry[0], m)  # the first message of a batch always fits
            entry[1].append(m)
            if m in alone:
                await submit(where, *building.pop(where))
        for where, entry in building.items():
            await submit(where, *entry)
        errors = await self._settled([f for f, _ in queued])
        return [(batch_messages, exc) for (_, batch_messages), exc in zip(queued, errors, strict=True) if exc]

    def _batch(self, topic: str) -> BatchBuilder:
        return BatchBuilder(min(BATCH_BYTES, self.limits[topic]), CODECS[self._codec])

    async def _enqueue(self, producer: AIOKafkaProducer, batch: BatchBuilder, topic: str, partition: int
                       ) -> asyncio.Future[Any]:  # fmt: skip
        """Hand one record batch to ``producer``, waiting (and counting the waits) while its partition's previous
        batch cannot reach the broker."""
        backoff = Backoff(self.config.retry_backoff_s, self.config.max_retry_backoff_s, self._rng)
        while True:
            try:
                future: asyncio.Future[Any] = await self._or_stop(
                    producer.send_batch(batch, topic, partition=partition)
                )
                return future
            except KafkaTimeoutError as exc:  # not queued: the same batch is offered again
                await self._pause(exc, backoff)

    async def _partitions_for(self, producer: AIOKafkaProducer, topic: str) -> set[int]:
        backoff = Backoff(self.config.retry_backoff_s, self.config.max_retry_backoff_s, self._rng)
        while True:
            try:
                return set(await self._or_stop(producer.partitions_for(topic)))
            except KafkaError as exc:  # no metadata for the topic while the broker is away
                await self._pause(exc, backoff)

    async def _or_stop(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless the daemon stops and it is still not done :data:`STOP_GRACE_S` later (it is
        cancelled: :class:`ProduceAborted`)."""
        task = asyncio.ensure_future(work)
        if self._stopping is None:
            return await task
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=STOP_GRACE_S)
        except BaseException:
            task.cancel()
            raise
        finally:
            stop.cancel()
        if not task.done():
            task.cancel()
            raise ProduceAborted("kafka: the broker cannot take a send while stopping")
        return task.result()

    async def _settled(self, futures: Sequence[asyncio.Future[Any] | BaseException]) -> list[BaseException | None]:
        """Every future's error (None for an acknowledgement), once all are settled; :class:`ProduceAborted` if the
        daemon stops and they are not settled :data:`STOP_GRACE_S` later, or, while the send is not stalled yet (the
        broker answering, the host slow), by the time it would count as stalled: aborting a send the producer still
        delivers would publish the batch's events again after the restart."""
        waiting = {f for f in futures if isinstance(f, asyncio.Future)}
        stalled = False
        stop = asyncio.ensure_future(self._stopping.wait()) if self._stopping is not None else None
        loop = asyncio.get_running_loop()
        stall_at = loop.time() + STALL_S
        try:
            while waiting:
                watch: set[asyncio.Future[Any]] = waiting | ({stop} if stop is not None else set())
                timeout = max(0.0, stall_at - loop.time()) if not stalled else None
                _, waiting = await asyncio.wait(watch, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                waiting.discard(stop)
                if stop is not None and stop.done() and waiting:  # acknowledgements due from a live broker come:
                    grace = STOP_GRACE_S if stalled else max(STOP_GRACE_S, stall_at - loop.time())  # (a slow host)
                    _, waiting = await asyncio.wait(waiting, timeout=grace)
                    if waiting:
                        raise ProduceAborted(f"kafka: {len(waiting)} record batches unacknowledged while stopping")
                if waiting and not stalled and loop.time() >= stall_at:
                    stalled = True
                    self._stall(+1)
                    self.telemetry.count("stalled_sends")
                    log.warning("kafka.waiting", batches=len(waiting), seconds=STALL_S)
        finally:
            if stop is not None:
                stop.cancel()
            if stalled:
                self._stall(-1)
        out: list[BaseException | None] = []
        for f in futures:
            if isinstance(f, asyncio.Future):
                out.append(None if not f.cancelled() and f.exception() is None else _error(f))
            else:
                out.append(f)
        return out

    def _stall(self, delta: int) -> None:
        self._stalled += delta
        self.telemetry.gauge("waiting_sends", self._stalled)

    async def _pause(self, exc: BaseException, backoff: Backoff) -> None:
        """Count one retry, log it, and wait the backoff's next delay; :class:`ProduceAborted` when stopping."""
        if self._stopping is not None and self._stopping.is_set():
            raise ProduceAborted(f"kafka: {type(exc).__name__} while stopping") from exc
        delay = backoff.next()
        self.telemetry.count("retries")
        log.warning("kafka.retry", error=type(exc).__name__, detail=str(exc)[:200], attempt=backoff.attempt,
                    backoff_s=round(delay, 3))  # fmt: skip
        self._stall(+1)
        try:
            if self._stopping is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                if self._stopping.is_set():
                    raise ProduceAborted(f"kafka: {type(exc).__name__} while stopping") from exc
        finally:
            self._stall(-1)

    async def _renew(self, generation: int) -> None:
        """A new producer (a new producer id, sequence numbers from zero) unless another send renewed it already
        since ``generation``; the old one finishes what is under way in the background, then stops."""
        async with self._renewing:
            if generation != self._generation:
                return
            backoff = Backoff(self.config.retry_backoff_s, self.config.max_retry_backoff_s, self._rng)
            while True:
                producer = self._new_producer()
                try:
                    await self._or_stop(producer.start())
                    break
                except KafkaError as exc:
                    await _stop(producer)
                    await self._pause(exc, backoff)
                except ProduceAborted:
                    await _stop(producer)
                    raise
            old, self._producer = self._producer, producer
            self._generation += 1
            self.telemetry.count("renewals")
            task = asyncio.create_task(_retire(old))
            task.producer = old  # type: ignore[attr-defined]
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    # ---- the Sink ---------------------------------------------------------------------------------------------

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (from the broker's metadata)."""
        return len(await self._producer.partitions_for(topic))

    def message(self, event: Published) -> Message:
        """``event`` as a message on the topic of its role, keyed by its fingerprint."""
        key = str(getattr(event, "fingerprint", "")).encode()
        return Message(self.config.topic(event.topic), key, event.model_dump_json().encode())

    async def publish(self, event: Published) -> None:
        """One event, acknowledged before this returns (``processors.api.component.Publish``)."""
        await self.send([self.message(event)])

    async def write(self, event: Published) -> None:
        await self.publish(event)

    async def flush(self) -> None:
        """Every write is acknowledged when it returns."""

    async def healthcheck(self) -> bool:
        """Started, and no send waiting for the broker right now."""
        return self._started and not self._stalled


def _error(future: asyncio.Future[Any]) -> BaseException:
    if future.cancelled():
        cancelled: BaseException = KafkaTimeoutError("record batch cancelled")
        return cancelled
    exc: BaseException | None = future.exception()
    assert exc is not None
    return exc


async def _stop(producer: AIOKafkaProducer) -> None:
    """``producer.stop()``, which delivers what it holds first, given up after :data:`STOP_GRACE_S` (the broker may
    be away: what it did not take is replayed after the restart); its sender and connections are closed all the
    same."""
    try:
        await asyncio.wait_for(producer.stop(), STOP_GRACE_S)
    except Exception:
        for part in (producer._sender, producer.client):  # what stop() had not reached yet
            with contextlib.suppress(Exception):
                await asyncio.wait_for(part.close(), 1.0)


async def _retire(producer: AIOKafkaProducer) -> None:
    """Let an old producer deliver what it still holds, then stop it."""
    with contextlib.suppress(Exception):
        await producer.flush()
        await producer.stop()


__all__ = ["KafkaSink", "Message", "ProduceAborted"]
