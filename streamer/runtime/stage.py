"""What both stages share: decoded inputs, offset pins from processor state, watermarks, processors, commit hooks.

A stage is synchronous and transport-free: ``process(records)`` returns a :class:`StageOutput` (graph rows, messages
to produce, events to publish, pins to release) and the runtime carries it out in commit order. Each record is
looked up in the stage's :class:`~streamer.decode.registry.Inputs` (topic -> signal + decoder), decoded, and handed
to the handler of its signal. While a record is handled, the stage's :class:`~streamer.runtime.pins.PinTracker`
knows it is the input being processed, so every keyed store it feeds pins it until the store releases it.

Containment, one rule: an exception while handling one record or one unit of state never leaves its component and
never escapes :meth:`Stage.process`.

- A record that cannot be decoded goes to the dead-letter topic with its reason; so does a record whose handling
  raises anything else (``internal_error:<type>``, with the component and the record's position in the headers),
  and the stage goes on with the next one.
- A unit of state whose handling raises after its input was consumed (a trace closing, a window closing, a row's
  changes being credited, a row being judged by a detector) is *quarantined*: dropped with its state, so that the
  input it held is released, counted (``dropped{component, reason=quarantined}``) and logged with the input
  offsets it came from (what the pins knew it held), the first of each kind with its traceback; the rest of the
  step completes. A processor reports its own quarantined units in ``Emit.quarantined``.
- A processor hook that raises is counted (``dropped{component=<processor>, reason=error}``) and logged once per
  kind (with its traceback); the other processors and the stage go on.
- Anything else that escapes the end of a batch (a bug in the stage's own bookkeeping) is counted
  (``dropped{component=<stage>, reason=batch_end_error}``) and logged with its traceback once per kind, and the
  batch's output so far is carried out: the stage keeps consuming and committing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any

import structlog

from processors.api.component import Emit, Processor
from processors.model.base import Published
from processors.model.units import NS, s_to_ns
from processors.state.lru import CountedLRU
from processors.state.watermarks import Watermarks
from streamer.config import CoreSettings
from streamer.decode.errors import DecodeError
from streamer.decode.registry import Input, Inputs, Record
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker, Source
from streamer.runtime.records import StageOutput, dead_letter

Handler = Callable[[Record, Sequence[Any], StageOutput], None]
log = structlog.get_logger("trace_repro.runtime")
QUARANTINE_LOGS = 20  # quarantined units logged one by one per batch; the rest of the batch's in one summary line
SHOWN_OFFSETS = 20  # input offsets named in a quarantine's log line


class Stage:
    """Base of the ingest and entities stages; subclasses declare ``handlers`` per signal and ``on_batch_end``."""

    name = "stage"

    def __init__(
        self,
        settings: CoreSettings,
        metrics: Metrics,
        clock: Callable[[], int],
        inputs: Sequence[Input],
        *,
        tracker: PinTracker | None = None,
        processors: Sequence[tuple[Processor, Sequence[str]]] = (),
    ) -> None:
        w = settings.windows
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self.assignment: set[tuple[str, int]] = set()  # input partitions this instance owns (set by the runner)
        self.broadcast_topic: str | None = None  # a topic this stage writes to every partition of (watermarks)
        self.broadcast_partitions = 0  # its partition count (set by the runner from the broker's metadata)
        self.tracker = tracker or PinTracker()
        self.watermarks = Watermarks(s_to_ns(w.allowed_lateness_s), s_to_ns(w.idle_s), clock)
        self.inputs = Inputs(inputs, settings.decode, metrics.telemetry)
        self.processors = [p for p, _ in processors]
        self._subscribers: dict[str, list[Processor]] = {}  # output topic role -> processors fed its events
        for processor, roles in processors:
            for role in roles:
                self._subscribers.setdefault(role, []).append(processor)
        self.handlers: dict[str, Handler] = {}
        self._failures: CountedLRU[tuple[str, str, str], None] = CountedLRU(256)  # failure kinds logged already
        self._quarantined = 0  # units quarantined in this batch (their log lines are bounded per batch)

    @property
    def topics_pattern(self) -> str:
        return self.inputs.pattern

    # ---- per batch -------------------------------------------------------------------------------------------

    def process(self, records: Iterable[Record]) -> StageOutput:
        """One batch: every record handled (or dead-lettered), then the end of the batch; never raises."""
        out = StageOutput()
        self._quarantined = 0
        consumed: dict[str, int] = {}  # per topic, counted once per batch
        lookup, feeding, decode, handlers = self.inputs.lookup, self.tracker.feeding, self.inputs.decode, self.handlers
        for record in records:
            topic = record.topic
            consumed[topic] = consumed.get(topic, 0) + 1
            source = lookup(topic)
            if source is None:
                continue
            feeding(record.source)
            try:
                handlers[source.signal](record, decode(source, record), out)
            except DecodeError as exc:
                self._dead_letter(record, exc.reason, str(exc), out)
            except Exception as exc:
                self.record_failed(record, self.name, exc, out)
        self.records_done(out)
        self.inputs.batch_done()
        self.tracker.feeding(None)
        for topic, n in consumed.items():
            self.metrics.consumed.labels(topic).inc(n)
        watermark = self.event_time()
        try:
            self.on_batch_end(watermark, out)
        except Exception as exc:  # every unit is guarded where it is handled: this is a bug in the stage itself
            self.metrics.telemetry(self.name).drop("batch_end_error")
            if self._failures.add((self.name, "batch_end", type(exc).__name__)):
                log.error("stage.batch_end_failed", stage=self.name, error=type(exc).__name__,
                          detail=str(exc)[:200], exc_info=exc)  # fmt: skip
        self.tracker.feeding(None)
        if self._quarantined > QUARANTINE_LOGS:
            log.error("state.quarantined_more", stage=self.name, count=self._quarantined - QUARANTINE_LOGS)
        out.release = self.tracker.take_released()
        self.metrics.watermark.labels(self.name).set(watermark / NS)
        self.metrics.pinned_offsets.labels(self.name).set(self.tracker.total())
        return out

    def record_failed(self, record: Record, component: str, exc: Exception, out: StageOutput) -> None:
        """Handling ``record`` raised in ``component``: the record goes to the dead-letter topic
        (``internal_error:<type>``); the first failure of each kind is logged with its traceback."""
        self._dead_letter(record, f"internal_error:{type(exc).__name__}", repr(exc), out, component)
        if self._failures.add((record.topic, component, type(exc).__name__)):  # log each kind once
            log.warning("record.failed", stage=self.name, component=component, topic=record.topic,
                        partition=record.partition, offset=record.offset, error=type(exc).__name__,
                        exc_info=exc)  # fmt: skip

    def _dead_letter(self, record: Record, reason: str, message: str, out: StageOutput, component: str = "") -> None:
        component = component or ("decode" if ":" not in reason else self.name)
        self.metrics.dlq.labels(reason).inc()
        self.metrics.telemetry(component).drop(reason)
        out.produce.append(dead_letter(record, self.settings.kafka.dlq_topic, reason, message, component))

    def quarantine(self, component: str, what: str, error: Exception, held: Iterable[tuple[str, Hashable]]) -> None:
        """A unit of state whose handling raised after its input was consumed (the caller drops it with its state,
        releasing its pins): counted (``dropped{component, reason=quarantined}``) and logged with the input offsets
        it held (the first of each kind with its traceback; at most ``QUARANTINE_LOGS`` lines per batch)."""
        self.metrics.telemetry(component).drop("quarantined")
        self._quarantined += 1
        if self._quarantined > QUARANTINE_LOGS:
            return
        sources = sorted({(tp, offset) for store, key in held for tp, offset in self.tracker.held(store, key)},
                         key=repr)  # fmt: skip
        inputs = [f"{tp[0]}/{tp[1]}@{offset}" if isinstance(tp, tuple) else f"{tp}@{offset}"
                  for tp, offset in sources[:SHOWN_OFFSETS]]  # fmt: skip
        first = self._failures.add((component, "quarantine", type(error).__name__))
        log.error("state.quarantined", stage=self.name, component=component, what=what[:200],
                  error=type(error).__name__, detail=str(error)[:200], inputs=inputs,
                  more_inputs=len(sources) - len(inputs), exc_info=error if first else None)  # fmt: skip

    def records_done(self, out: StageOutput) -> None:
        """After a batch's records, before its event time is read: what a handler held back across records (never
        past the batch) is handled now."""

    def event_time(self) -> int:
        """This stage's watermark (its own inputs' event time; the entities stage follows its upstream)."""
        return self.watermarks.current()

    def on_batch_end(self, watermark_ns: int, out: StageOutput) -> None:
        """Close what the watermark allows and let the processors emit."""
        self.emit(watermark_ns, None, out)

    def emit(self, watermark_ns: int, open_since_ns: int | None, out: StageOutput) -> Emit:
        """The processors' ``on_watermark``: their events and graph rows go into ``out``; returns what they emitted
        (stage 1 sends the relays on)."""
        emit = Emit(out.events, out.graph)
        for processor in self.processors:
            self.call(processor, processor.on_watermark, watermark_ns, open_since_ns, emit)
            for unit in emit.quarantined:
                self.quarantine(processor.name, unit.what, unit.error, unit.held)
            emit.quarantined.clear()
        return emit

    def call(self, processor: Processor, hook: Callable[..., None], *args: Any) -> bool:
        """One processor hook; an exception is counted against that processor and logged (the first of each kind
        with its traceback), never propagated. False when it raised."""
        try:
            hook(*args)
        except Exception as exc:
            self.failed(processor, hook.__name__, exc)
            return False
        return True

    def failed(self, processor: Processor, hook: str, exc: Exception) -> None:
        """``processor``'s ``hook`` raised ``exc`` (see :meth:`call`)."""
        self.metrics.telemetry(processor.name).drop("error")
        if self._failures.add((processor.name, hook, type(exc).__name__)):  # log each kind once
            log.error("processor.failed", stage=self.name, processor=processor.name, hook=hook,
                      error=type(exc).__name__, detail=str(exc)[:200], exc_info=exc)  # fmt: skip

    def on_event(self, event: Published, part: str = "") -> None:
        """An event from an output topic (partition ``part``), to the processors subscribed to its role."""
        for processor in self._subscribers.get(event.topic, ()):
            self.call(processor, processor.on_event, event, part)

    def _events(self, record: Record, events: Sequence[Any], out: StageOutput) -> None:
        for event in events:
            self.on_event(event, f"{record.topic}/{record.partition}")

    async def sync(self) -> None:
        """Before a batch: each processor reads what other instances wrote (a failure is counted, not fatal)."""
        for processor in self.processors:
            try:
                await processor.sync()
            except Exception as exc:
                self.metrics.telemetry(processor.name).drop("sync_error")
                if self._failures.add((processor.name, "sync", type(exc).__name__)):
                    log.warning("processor.sync_failed", processor=processor.name, error=type(exc).__name__,
                                exc_info=exc)  # fmt: skip

    async def prepare(self, records: Sequence[Record]) -> None:
        """Before a batch: what decoding it needs from other services (schemas from a registry); raises
        :class:`~streamer.decode.errors.DecodeUnavailable` while one is away (the runner retries)."""
        await self.inputs.prepare(records)

    # ---- runtime hooks ----------------------------------------------------------------------------------------

    def release(self, sources: Iterable[Source]) -> None:
        self.tracker.release(sources)
        self.metrics.pinned_offsets.labels(self.name).set(self.tracker.total())

    def progress(self, caught_up: Collection[tuple[str, int]]) -> None:
        """Before a batch: the input partitions the consumer has read to their end (only those can be idle)."""
        self.watermarks.progress(caught_up)

    def committable(self, tp: Hashable, position: int) -> int:
        return self.tracker.committable(tp, position)

    def assign(self, tps: Iterable[tuple[str, int]]) -> None:
        new = set(tps) - self.assignment
        self.assignment |= new
        for topic, partition in sorted(new):
            for processor in self.processors:
                self.call(processor, processor.on_assign, f"{topic}/{partition}")

    def forget(self, tp: Hashable) -> None:
        self.assignment.discard(tp)
        self.tracker.forget(tp)
        self.watermarks.forget(tp)
        if isinstance(tp, tuple):
            part = f"{tp[0]}/{tp[1]}"
            for processor in self.processors:
                self.call(processor, processor.on_revoke, part)
