"""Feed output events from Kafka to a sink (GitLab, files, the repro worker), as a consumer group of its own.

Each sink consumes the output topics from its own committed offsets, so a slow, failing or unreachable sink never
holds the detectors (or the other sinks) back and loses nothing.

**Commit order.** Every event read is ``write`` n to the sink once, then the sink is ``flush`` ed; the offsets of
the sink's consumer group are committed only after a flush succeeded, and only up to the last message the sink
accepted. A sink that cannot take more (``write`` raises ``RetryableSinkError``, such as a full GitLab queue) is
fed nothing more: that message's partition is sought back to it, so it is read again later, never skipped.

**Nothing twice.** The runner holds the ids (``Published.event_id``; a digest of the JSON for kinds without identity
fields) of the events it wrote since the last successful flush, and never writes an event with one of those ids
again: a flush that failed is retried by flushing again, never by reading and writing the batch again, and an event
read twice (a rebalance, a duplicate on the topic) is skipped and counted (``duplicates``). The sink contract this
relies on: a sink keeps every event written to it until a flush delivers it or refuses it for good
(``PermanentSinkError``), whatever the flush raised. Sinks stay idempotent per event across restarts (replay).

**Failures.** A flush that raises ``PermanentSinkError`` dropped one event (counted ``rejected``); the runner flushes
again for the rest. ``RetryableSinkError`` and *any other exception* (a bug in a sink) put the runner in the
*retrying* state: the attempt is counted (``retries``, and ``errors`` for an unexpected exception), logged with the
error's type when the state or the error type changes (never per event), and the flush is attempted again after a
jittered exponential backoff (``backoff_s`` doubling up to ``max_backoff_s``), never sooner than the sink's
``retry_after_s`` (HTTP ``Retry-After``), which counts for at most ``max_retry_after_s`` (a hint of ``inf`` or of
centuries must not wedge the runner; the GitLab sink caps its own at ``gitlab.max_retry_after_s``). Meanwhile the
runner keeps reading and writing new events, at most ``max_held`` of them held by the sink, then it pauses its
partitions. One sink failing never stops the daemon.

**Parking.** A retryable error with ``parked = True`` (``GitLabParkedError``: 401, 403, 404 on the project) means
the destination refuses the sink as a whole. The runner then sets ``trace_repro_sink_parked{sink}`` to 1, logs
``sink.parked`` once, and every ``probe_s`` (doubling up to ``max_probe_s``, jittered) runs the sink's
``healthcheck``; when it passes, it flushes: the sink delivers every kept event in order and the runner commits,
logs ``sink.resumed`` and sets the gauge to 0. A flush that fails again with a parking error keeps it parked.

States: ``running`` -(retryable or other error)-> ``retrying`` -(parking error)-> ``parked``; ``running``
-(parking error)-> ``parked``; ``parked`` -(probe passes, flush fails retryably)-> ``retrying``; ``retrying`` and
``parked`` -(flush succeeds)-> ``running``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import random
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import IllegalStateError, KafkaError
from pydantic import ValidationError

from processors.api.sink import Backoff, PermanentSinkError, RetryableSinkError, Sink
from processors.model.base import Published
from processors.model.outputs import parse_event
from sinks.kafka.client import client_kwargs
from streamer.config import CoreSettings
from streamer.runtime.consumers import stop_consumer
from streamer.runtime.metrics import Metrics

log = structlog.get_logger("trace_repro.sinks")

RUNNING, RETRYING, PARKED = "running", "retrying", "parked"
BATCH = 200  # messages per poll
FLUSH_GRACE_S = 15.0  # a flush under way when the daemon stops may finish within this
PROBE_TIMEOUT_S = 10.0
COMMIT_TIMEOUT_S = 5.0
BACKLOG_EVERY_S = 5.0  # how often the backlog gauge asks the broker for the output topics' end offsets


def event_key(event: Published) -> str:
    """The id the runner de-duplicates by: ``event_id``, or the kind and a digest of the JSON without identity."""
    if type(event).identity:
        return event.event_id
    return f"{event.event_id}\x1f{hashlib.sha256(event.model_dump_json().encode()).hexdigest()}"


class SinkRunner:
    """Runs one sink as consumer group ``<group_id>.sink.<name>`` until ``stop`` is set; see the module docstring."""

    def __init__(
        self,
        name: str,
        sink: Sink,
        *,
        settings: CoreSettings,
        topics: list[str],
        metrics: Metrics,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        probe_s: float = 5.0,
        max_probe_s: float = 60.0,
        max_held: int = 1000,
        max_retry_after_s: float = 3600.0,
        backlog_every_s: float = BACKLOG_EVERY_S,
        rng: random.Random | None = None,
    ) -> None:
        if max_held < 1:
            raise ValueError("max_held must be >= 1")
        self.name = name
        self.sink = sink
        self.settings = settings
        self.topics = topics
        self.metrics = metrics
        self.max_held = max_held
        self.max_retry_after_s = max_retry_after_s
        self.backlog_every_s = backlog_every_s
        self.telemetry = metrics.telemetry(f"sink.{name}").declare("invalid_event", "rejected")
        rng = rng or random.Random()
        self._retry = Backoff(backoff_s, max_backoff_s, rng)
        self._probe = Backoff(probe_s, max_probe_s, rng)
        self.consumer: AIOKafkaConsumer | None = None
        self.state = RUNNING
        self.delivered = 0  # events written to the sink
        self._held: dict[str, None] = {}  # ids of the events written since the last successful flush
        self._positions: dict[TopicPartition, int] = {}  # next offset after the last message the sink accepted
        self._committed: dict[TopicPartition, int] = {}
        self._blocked = False  # the sink refused a write: feed nothing until a flush succeeds
        self._write_failed = False  # ... and that refusal was an unexpected exception
        self._due = 0.0  # monotonic time of the next flush attempt (or probe) while not running
        self._error = ""  # type of the last failure, to log changes only
        self._flushing = asyncio.Lock()  # held while a flush and its commit are under way
        self.metrics.sink_parked.labels(name).set(0)
        self._measured = 0.0  # monotonic time the backlog was last measured

    @property
    def group_id(self) -> str:
        return f"{self.settings.kafka.group_id}.sink.{self.name}"

    @property
    def held(self) -> int:
        """Events written to the sink and not yet flushed."""
        return len(self._held)

    # ---- the loop ---------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        k = self.settings.kafka
        consumer = self.consumer = AIOKafkaConsumer(
            **client_kwargs(k, f"sink-{self.name}"),
            group_id=self.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # the daemon's own outputs: all of them were written for the sinks
        )
        consumer.subscribe(list(self.topics), listener=_WaitForFlush(self._flushing))
        await consumer.start()
        try:
            while not stop.is_set():
                try:
                    await self._step(consumer, stop)
                except Exception as exc:  # the broker, or a bug here: nothing past it was committed; carry on
                    self.telemetry.count("errors")
                    log.warning("sink.runner_error", sink=self.name, error=type(exc).__name__, detail=str(exc)[:200])
                    await _sleep_unless(stop, self._retry.next())
        finally:
            with contextlib.suppress(Exception):
                await stop_consumer(consumer, f"sink.{self.name}")
            try:
                await self.sink.close()
            except Exception as exc:
                log.warning("sink.close_failed", sink=self.name, error=type(exc).__name__)

    async def _step(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """One poll, then a flush when one is due."""
        room = self.max_held - len(self._held)
        feeding = room > 0 and not self._blocked
        if feeding:
            consumer.resume(*consumer.paused())
        else:
            consumer.pause(*consumer.assignment())
        timeout_ms = self.settings.poll_timeout_ms
        if self.state != RUNNING:
            timeout_ms = max(0, min(timeout_ms, int((self._due - time.monotonic()) * 1000)))
        batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=max(1, min(BATCH, room)))
        fed = await self._feed(consumer, batch, accept=feeding) if batch else False
        if self.state == RUNNING:
            if fed or self._blocked or self._uncommitted():
                await self._attempt(consumer, stop)
        elif time.monotonic() >= self._due:
            await self._attempt(consumer, stop)
        if time.monotonic() - self._measured >= self.backlog_every_s:
            await self._measure_backlog(consumer)

    async def _measure_backlog(self, consumer: AIOKafkaConsumer) -> None:
        """``trace_repro_sink_backlog_messages``: the end offsets (asked of the broker: a paused partition's
        fetched high watermark is stale) minus what the sink has committed, over its partitions."""
        self._measured = time.monotonic()
        assigned = list(consumer.assignment())
        if not assigned:
            return
        # Bounded as a whole: with the broker away, ``committed`` waits for the group's coordinator for ever, and the
        # runner with it (a stop request would never be seen).
        try:
            backlog = await asyncio.wait_for(self._backlog(consumer, assigned), PROBE_TIMEOUT_S)
        except (KafkaError, TimeoutError, IllegalStateError, AssertionError):
            return  # measured again on the next step
        self.metrics.sink_backlog.labels(self.name).set(backlog)

    async def _backlog(self, consumer: AIOKafkaConsumer, assigned: list[TopicPartition]) -> int:
        ends = await consumer.end_offsets(assigned)
        backlog = 0
        for tp, end in ends.items():
            done = self._committed.get(tp)
            if done is None:
                done = await consumer.committed(tp) or 0
            backlog += max(0, end - done)
        return backlog

    async def _feed(self, consumer: AIOKafkaConsumer, batch: dict[TopicPartition, list[Any]], *, accept: bool
                    ) -> bool:  # fmt: skip
        """Write the batch's new events to the sink; True when a message was taken. A partition whose message the
        sink refused (or that may not be fed now) is sought back to it."""
        taken = False
        for tp, messages in batch.items():
            for m in messages:
                if not accept or not await self._write(m.value):
                    accept = False
                    with contextlib.suppress(IllegalStateError, KafkaError, AssertionError):  # revoked meanwhile
                        consumer.seek(tp, m.offset)
                    break
                self._positions[tp] = m.offset + 1
                taken = True
        return taken

    async def _write(self, value: bytes | None) -> bool:
        """Give one message's event to the sink; False when the sink refused it (it is read again later)."""
        try:
            event = parse_event(value)
        except (ValueError, ValidationError) as exc:
            self.telemetry.drop("invalid_event")
            log.error("sink.invalid_event", sink=self.name, error=str(exc)[:300])
            return True
        if event is None:
            return True
        key = event_key(event)
        if key in self._held:
            self.telemetry.count("duplicates")
            return True
        try:
            await self.sink.write(event)
        except RetryableSinkError as exc:  # full: stop feeding until a flush made room
            self._blocked = True
            if self.state == RUNNING:
                log.info("sink.full", sink=self.name, held=len(self._held), error=type(exc).__name__)
            return False
        except Exception as exc:  # a bug in the sink: as for a failed flush, back off and try again
            self._blocked = self._write_failed = True
            self._failed(exc)
            return False
        self._held[key] = None
        self.delivered += 1
        return True

    def _uncommitted(self) -> bool:
        return any(self._committed.get(tp) != offset for tp, offset in self._positions.items())

    # ---- flushing, failing, parking ---------------------------------------------------------------------------

    async def _attempt(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        """Flush (a parked sink only once its health check passes); on success commit what the sink accepted."""
        if self.state == PARKED and not await self._healthy():
            self._due = time.monotonic() + self._probe.next()
            return
        async with self._flushing:  # a rebalance waits for it: the new owner must not deliver the same events meanwhile
            try:
                # Stopping lets a flush under way finish (GitLab steps run in threads that cancelling would not
                # stop: the next owner would then race them on the same issue).
                done = await _unless_stopped(stop, self._flush(), grace_s=FLUSH_GRACE_S)
            except Exception as exc:
                self._failed(exc)
                return
            if not done:  # stopping: the held events are read again after the restart
                return
            if not self._write_failed:  # (a write that raised is tried again before the sink counts as recovered)
                self._recovered()
            self._held.clear()
            self._blocked = self._write_failed = False
            await self._commit(consumer)

    async def _flush(self) -> None:
        """``flush`` until it succeeds; each ``PermanentSinkError`` dropped one event, so they are bounded."""
        for _ in range(len(self._held) + 1):
            try:
                await self.sink.flush()
                return
            except PermanentSinkError as exc:  # that event is dropped by the sink; deliver the rest
                self.telemetry.drop("rejected")
                log.error("sink.rejected", sink=self.name, error=type(exc).__name__, detail=str(exc)[:300])
        raise RuntimeError(f"{self.name}: more permanent refusals than events held")

    async def _healthy(self) -> bool:
        try:
            return bool(await asyncio.wait_for(self.sink.healthcheck(), PROBE_TIMEOUT_S))
        except Exception:
            return False

    def _failed(self, exc: BaseException) -> None:
        """Count the failure, enter ``retrying`` or ``parked``, log a change, and schedule the next attempt."""
        parked = isinstance(exc, RetryableSinkError) and bool(getattr(exc, "parked", False))
        expected = isinstance(exc, RetryableSinkError)
        self.telemetry.count("retries")
        if not expected:
            self.telemetry.count("errors")
        state = PARKED if parked else RETRYING
        error = type(exc).__name__
        if state != self.state or error != self._error:
            event = "sink.parked" if parked else "sink.retrying"
            log.warning(event, sink=self.name, error=error, detail=str(exc)[:200], held=len(self._held),
                        unexpected=not expected)  # fmt: skip
        if state != self.state:
            self._retry.reset()
            self._probe.reset()
        self.state, self._error = state, error
        self.metrics.sink_parked.labels(self.name).set(1 if parked else 0)
        delay = self._probe.next() if parked else self._retry.next(self._hint(exc))
        self._due = time.monotonic() + delay

    def _hint(self, exc: BaseException) -> float | None:
        """The sink's own wait (HTTP ``Retry-After``), at most ``max_retry_after_s``; NaN is no hint."""
        hint = exc.retry_after_s if isinstance(exc, RetryableSinkError) else None
        return None if hint is None or math.isnan(hint) else min(hint, self.max_retry_after_s)

    def _recovered(self) -> None:
        if self.state != RUNNING:
            log.info("sink.resumed" if self.state == PARKED else "sink.recovered", sink=self.name,
                     attempts=self._retry.attempt + self._probe.attempt, held=len(self._held))  # fmt: skip
            self.state, self._error = RUNNING, ""
            self.metrics.sink_parked.labels(self.name).set(0)
        self._retry.reset()
        self._probe.reset()

    async def _commit(self, consumer: AIOKafkaConsumer) -> None:
        assigned = consumer.assignment()
        for tp in [tp for tp in self._positions if tp not in assigned]:  # revoked: its new owner reads it again
            del self._positions[tp]
            self._committed.pop(tp, None)
        offsets = {tp: offset for tp, offset in self._positions.items() if self._committed.get(tp) != offset}
        if not offsets:
            return
        try:
            await asyncio.wait_for(consumer.commit(offsets), COMMIT_TIMEOUT_S)  # the broker may be away
        except (KafkaError, TimeoutError) as exc:  # committed with the next flush, or replayed: idempotent per event
            log.warning("sink.commit_failed", sink=self.name, error=type(exc).__name__, detail=str(exc)[:200])
            return
        self._committed.update(offsets)


class _WaitForFlush(ConsumerRebalanceListener):  # type: ignore[misc]
    """Partitions are handed over only once a flush under way has finished (and committed what it delivered)."""

    def __init__(self, flushing: asyncio.Lock) -> None:
        self.flushing = flushing

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        async with self.flushing:
            pass

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        return None


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _unless_stopped(stop: asyncio.Event, work: Any, *, grace_s: float = 0.0) -> bool:
    """Run the coroutine ``work`` unless ``stop`` is set first and it does not complete within ``grace_s`` more
    (then cancel it): True when it completed."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and grace_s > 0:
            await asyncio.wait([task], timeout=grace_s)
    except BaseException:  # the runner itself is cancelled: so is the work
        task.cancel()
        raise
    finally:
        stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        return False
    task.result()  # raises what the work raised
    return True
