"""The ingest stage (stage 1): spans, logs and row changes in; traces, windows, graph rows and accesses out.

Inputs (``[kafka]``): the spans and logs topics (decoded as ``kafka.span_encoding``), the Debezium topics
(``kafka.cdc_pattern``), and two of trace-repro's own output topics, incidents and contracts, whose events go to the
processors that subscribed to them (the proof desk). Spans assemble into traces that close in event time; a closed
trace becomes graph rows (as the detail policy says), CALLS aggregates, the row accesses of its DB spans (published
to the internal topic for the entities stage: a batch's accesses packed, one message per partition of their entity
keys, ``streamer.decode.internal.pack_accesses``) and input for this stage's processors (the
regression statistics, the proof desk), whose relays (a closed statistics window's shares) go to the internal topic
too, ahead of the watermark. Row changes pass straight through to the internal topic.

Event time flows on: after every batch this stage publishes its *low watermark* into every partition of the
internal topic, for the spans partitions it owns: its watermark, held back to the start of the oldest trace still
open (every trace with a span before it has closed and its accesses are on the internal topic, ahead of the
watermark in each partition), and to the commit time an active Debezium partition has reached (a connector or a
consumer behind on row changes holds the entities stage back instead of letting it judge rows without them). The
entities stage's event time is the minimum of these.

Clock sanity comes first, before anything sees a time: a span ending more than ``windows.max_future_skew_s`` after
the wall clock, or one longer than ``windows.max_span_duration_s`` (or ending before it starts), and a row change
committed in the future beyond that skew are never assembled, fed to watermarks (the spans' or Debezium's), to the
table keys or to retention: they are dropped and counted (``clock``), and the original message is dead-lettered
(reason ``clock_skew``) so that nothing is lost.

Containment (see :mod:`streamer.runtime.stage`): a span's detail (its attributes) is read while its message is at
hand (the decoder reads it as it decodes; one it left unread is read here), so a span whose detail cannot be read is
dropped and its message dead-lettered (``internal_error:<type>``, component ``decode``) while the message's other
spans are kept. A trace whose handling raises when it closes (SQL analysis, graph rows, CALLS) and a window whose
rows raise are quarantined: their rows and messages are taken back out of the batch's output, they are counted and
logged with the input offsets they held, and the other traces and windows close as usual.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from typing import Any

import structlog

from processors.api.component import GraphQueries, Processor
from processors.codeloc import build_locator
from processors.graph.rows import trace_rows, window_rows
from processors.model.events import Access, LogRecord, RowChange
from processors.model.span import Span, read_details
from processors.model.trace import ClosedTrace
from processors.model.units import MS_NS, s_to_ns
from processors.pipeline.accesses import accesses_of
from processors.pipeline.calls import CallWindows
from processors.pipeline.traces import TraceAssembler
from processors.sql import SqlAccessExtractor, identity_entity_key
from processors.state.watermarks import Watermarks
from streamer.config import CoreSettings
from streamer.decode import internal
from streamer.decode.registry import Input, Record
from streamer.runtime.low_watermark import Publication, low_watermark
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker, Source
from streamer.runtime.records import Message, SpanRun, StageOutput
from streamer.runtime.stage import Stage

KEYS_EVERY_NS = 30_000_000_000  # table keys learned elsewhere are loaded from the graph this often
log = structlog.get_logger("trace_repro")


def ingest_inputs(settings: CoreSettings) -> list[Input]:
    k = settings.kafka
    return [
        Input("spans", f"{k.span_encoding}.traces", topics=(k.spans_topic,)),
        Input("logs", f"{k.span_encoding}.logs", topics=(k.logs_topic,)),
        Input("row_changes", "debezium", pattern=k.cdc_pattern),
        Input("events", "events", topics=(k.incidents_topic, k.contracts_topic)),
    ]


class IngestStage(Stage):
    """Stage 1; see the module docstring."""

    name = "ingest"

    def __init__(
        self,
        settings: CoreSettings,
        metrics: Metrics,
        clock: Callable[[], int],
        *,
        tracker: PinTracker | None = None,
        processors: Sequence[tuple[Processor, Sequence[str]]] = (),
        graph: GraphQueries | None = None,
    ) -> None:
        super().__init__(settings, metrics, clock, ingest_inputs(settings), tracker=tracker, processors=processors)
        w, sql = settings.windows, settings.sql
        telemetry = metrics.telemetry
        self.traces = TraceAssembler(s_to_ns(w.trace_gap_s), w.max_open_traces, w.max_spans_per_trace,
                                     max_bytes=w.max_open_trace_bytes, max_request_ns=s_to_ns(w.max_request_s),
                                     telemetry=telemetry("traces"),
                                     events=self.tracker)  # fmt: skip
        self.calls = CallWindows(s_to_ns(w.window_s), s_to_ns(w.trace_gap_s), max_windows=w.max_windows,
                                 telemetry=telemetry("calls"), events=self.tracker)  # fmt: skip
        self.extractor = SqlAccessExtractor(key_columns=sql.key_columns or None,
                                            version_columns=tuple(sql.version_columns),
                                            insert_identity=sql.insert_identity or None,
                                            cache_size=sql.statement_cache, max_tables=sql.max_tables,
                                            telemetry=telemetry("sql"))  # fmt: skip
        self.locator = build_locator(settings.codeloc, telemetry("codeloc"))  # reads the checkout, when one is set
        self.graph = graph
        # Debezium's progress per CDC partition (commit times; no lateness): the low watermark never passes the
        # commits an active CDC partition has yet to deliver (a backlog, a lagging connector).
        self.cdc_marks = Watermarks(0, s_to_ns(w.idle_s), clock)
        self._keys_loaded_ns: int | None = None
        self._unkeyed: dict[str, Any] = {}  # table -> its unkeyed statements' counter (see _count_unkeyed)
        self.handlers = {"spans": self._spans, "logs": self._logs, "row_changes": self._row_changes,
                         "events": self._events}  # fmt: skip
        self._forced: list[ClosedTrace] = []
        self._last_retention_ns = 0
        self.broadcast_topic = settings.kafka.accesses_topic
        self._published = Publication()
        self._future_ns = s_to_ns(w.max_future_skew_s)
        self._longest_ns = s_to_ns(w.max_span_duration_s)
        self._clock_drops = telemetry("clock").declare("future_time", "absurd_duration")
        self._decoded_spans = metrics.decoded.labels("span")  # once a batch: its child, not a label lookup each
        self._decoded = 0  # spans decoded in this batch so far
        self._late_spans = metrics.late.labels("span")
        self._run: SpanRun | None = None  # the batch's span messages of one partition not yet assembled
        self._packed: list[Access] = []  # the batch's accesses, packed at its end (``_pack``)

    # ---- handlers ----------------------------------------------------------------------------------------------

    def _spans(self, record: Record, spans: Sequence[Span], out: StageOutput) -> None:
        """A message's spans join the run of its partition's messages, assembled together (``_assemble``)."""
        self._decoded += len(spans)
        spans = self._sane(record, spans, out)
        spans = self._readable(record, spans, out)
        if not spans:
            return
        run = self._run
        if run is None or run.tp[1] != record.partition or run.tp[0] != record.topic:
            self._assemble(out, record.source)
            run = self._run = SpanRun(record)
        run.add(record, spans)

    def records_done(self, out: StageOutput) -> None:
        self._assemble(out, None)
        if self._decoded:
            self._decoded_spans.inc(self._decoded)
            self._decoded = 0

    def _assemble(self, out: StageOutput, then: Source | None) -> None:
        """The pending run of one partition's span messages into the open traces, in one step: the messages of a
        batch are consecutive offsets, and a trace holds the oldest offset of a partition that fed it (see
        :class:`~streamer.runtime.pins.PinTracker`), so the run feeds its traces as its first message. Spans of a
        message ending behind the watermark (as it was before the run) are counted late. ``then``: the input being
        processed afterwards."""
        run, self._run = self._run, None
        if run is None:
            return
        self.tracker.feeding(run.records[0].source)
        try:
            behind = self.watermarks.current()
            late = sum(n for end, n in run.ends if end < behind)
            if late:
                self._late_spans.inc(late)
            self.watermarks.observe(run.tp, max(end for end, _ in run.ends))
            self._forced += self.traces.add(run.spans, run.bytes)
        except Exception as exc:
            for record in run.records:
                self.record_failed(record, self.name, exc, out)
        finally:
            self.tracker.feeding(then)

    def _sane(self, record: Record, spans: Sequence[Span], out: StageOutput) -> Sequence[Span]:
        """The spans whose times are believable; the others are dropped, counted and their message dead-lettered."""
        limit, longest = self.clock() + self._future_ns, self._longest_ns
        for s in spans:  # most messages: every span sane, found in one pass
            end = s.end_ns
            if end > limit or not 0 <= end - s.start_ns <= longest:
                break
        else:
            return spans
        future = sum(1 for s in spans if s.end_ns > limit)
        absurd = sum(1 for s in spans if s.end_ns <= limit and not 0 <= s.end_ns - s.start_ns <= self._longest_ns)
        if not future and not absurd:
            return spans
        self._clock_drops.drop("future_time", future)
        self._clock_drops.drop("absurd_duration", absurd)
        self._dead_letter(record, "clock_skew", f"{future} span(s) ending beyond the wall clock + "
                          f"{self._future_ns / 1e9:g} s, {absurd} with an absurd duration", out)  # fmt: skip
        kept: list[Span] = []
        for s in spans:
            if s.end_ns <= limit and 0 <= s.end_ns - s.start_ns <= self._longest_ns:
                kept.append(s)
            else:
                self.traces.lost((s.trace_id,))  # a parent its trace's spans await may be this one
        return kept

    def _readable(self, record: Record, spans: Sequence[Span], out: StageOutput) -> Sequence[Span]:
        """The spans whose detail reads (read now: a span kept in an open trace then holds nothing of its decoded
        message); one that raises is dropped and its message dead-lettered, once, while the others are kept."""
        try:
            read_details(spans)
        except Exception:  # find which: the others keep going
            return self._readable_ones(record, spans, out)
        return spans

    def _readable_ones(self, record: Record, spans: Sequence[Span], out: StageOutput) -> Sequence[Span]:
        kept: list[Span] = []
        failed: Exception | None = None
        for span in spans:
            try:
                read_details((span,))
            except Exception as exc:
                failed = failed or exc
                self.traces.lost((span.trace_id,))  # a parent its trace's spans await may be this one
                continue
            kept.append(span)
        if failed is not None:
            self.metrics.telemetry("decode").drop("span_detail", len(spans) - len(kept))
            self.record_failed(record, "decode", failed, out)
        return kept

    def _logs(self, record: Record, logs: Sequence[LogRecord], out: StageOutput) -> None:
        self.metrics.decoded.labels("log").inc(len(logs))
        for log_record in logs:
            for processor in self.processors:
                self.call(processor, processor.on_log, log_record, f"{record.topic}/{record.partition}")

    def _row_changes(self, record: Record, changes: Sequence[RowChange], out: StageOutput) -> None:
        """Row changes do not move this stage's watermark: it closes traces and windows, which row changes do not
        feed, and Debezium's delivery delay would hold trace closing back. The entities stage judges them."""
        if not changes:
            self.metrics.decoded.labels("tombstone").inc()
        topic = self.settings.kafka.accesses_topic
        self.metrics.decoded.labels("row_change").inc(len(changes))
        limit = self.clock() + self._future_ns
        sane = [c for c in changes if c.commit_ts_ms * MS_NS <= limit]  # before anything sees their times
        if len(sane) < len(changes):
            future = len(changes) - len(sane)
            self._clock_drops.drop("future_time", future)
            self._dead_letter(record, "clock_skew", f"{future} change(s) committed beyond the wall clock + "
                              f"{self._future_ns / 1e9:g} s", out)  # fmt: skip
        if sane:
            self.cdc_marks.observe((record.topic, record.partition), max(c.commit_ts_ms for c in sane) * MS_NS)
        for change in sane:
            self.extractor.keys.learn(change)
            out.produce.append(Message(topic, self._routing_key(change).encode(), internal.encode_row_change(change)))

    def _count_unkeyed(self, table: str) -> None:
        """``trace_repro_unkeyed_statements_total{table}``, at most ``sql.max_tables`` tables (then ``_other``); each
        table's counter is looked up once (``labels`` costs more than the count, and most accesses count here)."""
        counter = self._unkeyed.get(table)
        if counter is None:
            if len(self._unkeyed) >= self.settings.sql.max_tables:
                table = "_other"
            if (counter := self._unkeyed.get(table)) is None:
                counter = self._unkeyed[table] = self.metrics.unkeyed.labels(table)
        counter.inc()

    async def sync(self) -> None:
        """Before a batch: the table keys other instances and earlier runs learned (at start, then every 30 s)."""
        await super().sync()
        now = self.clock()
        if self.graph is None or (self._keys_loaded_ns is not None and now - self._keys_loaded_ns < KEYS_EVERY_NS):
            return
        self._keys_loaded_ns = now
        try:
            self.extractor.keys.load(await self.graph.table_keys())
        except Exception as exc:  # tried again in 30 s; keys are learned from the row changes meanwhile
            self.metrics.telemetry("sql").drop("keys_load_error")
            log.warning("sql.keys_load_failed", error=type(exc).__name__)

    def _routing_key(self, change: RowChange) -> str:
        """The entity key stage 2 partitions by; inserts keyed by identity columns route like their statements."""
        bare = change.table.rsplit(".", 1)[-1]
        identity = self.settings.sql.insert_identity.get(bare)
        image = change.after or change.before or {}
        if identity and all(c in image for c in identity):
            return identity_entity_key(bare, identity, [image[c] for c in identity])
        return change.entity_key

    def assign(self, tps: Iterable[tuple[str, int]]) -> None:
        tps = list(tps)
        for tp in set(tps) - self.assignment:
            source = self.inputs.lookup(tp[0])
            if tp[0] == self.settings.kafka.spans_topic:
                self.watermarks.assign(tp)
            elif source is not None and source.signal == "row_changes":  # its backlog holds stage 2 back
                self.cdc_marks.assign(tp)
        super().assign(tps)

    def progress(self, caught_up: Collection[tuple[str, int]]) -> None:
        super().progress(caught_up)
        self.cdc_marks.progress(caught_up)

    def forget(self, tp: Hashable) -> None:
        """A revoked partition: the open traces only it fed go (its next owner replays them whole), then its pins,
        windows and watermark."""
        for tid in self.traces.open_ids():
            held = self.tracker.held("traces", tid)
            if held and all(source[0] == tp for source in held):
                self.traces.discard(tid)
        super().forget(tp)
        self.cdc_marks.forget(tp)
        if isinstance(tp, tuple):
            self.calls.forget_part(f"{tp[0]}/{tp[1]}")

    # ---- event time -------------------------------------------------------------------------------------------

    def on_batch_end(self, watermark_ns: int, out: StageOutput) -> None:
        forced, self._forced = self._forced, []
        packed = self._packed = []  # (a batch that raised half-way left nothing here for this one)
        for trace in itertools.chain(forced, self.traces.closing(watermark_ns, spread=True)):  # see closing
            held = self.tracker.inherit("traces", trace.trace_id)  # what the trace feeds holds the input it held
            mark, accesses = out.mark(), len(packed)
            try:
                object.__setattr__(trace, "part", _home(held))  # (just closed, held by no one else: not copied)
                self._closed_trace(trace, out)
            except Exception as exc:  # its rows and messages go; its input is released with the closed trace's
                out.rollback(mark)
                del packed[accesses:]
                self.quarantine("traces", f"trace {trace.trace_id}", exc, [("traces", trace.trace_id)])
        self.tracker.feeding(None)
        if packed:
            self._pack(packed, out)
        open_since = self.traces.oldest_start()
        for window in self.calls.close_until(watermark_ns, open_since):
            mark = out.mark()
            try:
                window_rows(window, out.graph)
            except Exception as exc:
                out.rollback(mark)
                self.quarantine("calls", f"window {window.window_id}", exc, ())
        relays = self.emit(watermark_ns, open_since, out).relays  # ahead of the watermark that promises them
        topic = self.settings.kafka.accesses_topic
        for relay in relays:
            try:
                out.produce.append(Message(topic, relay.key.encode(), internal.encode_relay(relay)))
            except Exception as exc:
                self.quarantine(relay.component, f"relay {relay.key}", exc, ())
        out.graph.tables.extend({"name": t, "key": list(k)} for t, k in self.extractor.keys.fresh().items())
        self._publish_watermark(self._low_watermark(watermark_ns, open_since), out)
        self._retention(watermark_ns, out)
        self.metrics.open_traces.set(len(self.traces))
        self.metrics.open_windows.set(len(self.calls))

    def _closed_trace(self, trace: ClosedTrace, out: StageOutput) -> None:
        accesses = accesses_of(trace, self.extractor, self.locator)
        for a in accesses:
            if not a.keyed:
                self._count_unkeyed(a.table)
        trace_rows(trace, accesses, self.settings.graph_policy.detail, out.graph)
        if self.broadcast_partitions:  # packed at the batch's end (``_pack``)
            self._packed += accesses
        else:  # the topic's partitions unknown: each alone, keyed (the producer's partitioner places it)
            topic = self.settings.kafka.accesses_topic
            out.produce.extend(Message(topic, a.entity.encode(), internal.encode_access(a)) for a in accesses)
        if trace.late:
            self.metrics.late.labels("trace").inc()
        self.calls.add(trace)
        self.metrics.sampled.add(trace)  # kept vs represented traffic (processors.pipeline.sampled_traffic)
        for processor in self.processors:  # (``call``, spelt out: it runs for each processor of every closed trace)
            try:
                processor.on_trace(trace, accesses)
            except Exception as exc:
                self.failed(processor, "on_trace", exc)

    def _pack(self, packed: list[Access], out: StageOutput) -> None:
        """The batch's accesses, packed: one message per internal partition (``internal.pack_accesses``), ahead of
        the watermark that promises them."""
        k = self.settings.kafka
        for partition, value in internal.pack_accesses(packed, self.broadcast_partitions, k.accesses_message_bytes):
            out.produce.append(Message(k.accesses_topic, None, value, partition=partition))

    def _low_watermark(self, watermark_ns: int, open_since: int | None) -> int:
        """What this instance promises (``streamer.runtime.low_watermark.low_watermark``)."""
        return low_watermark(watermark_ns, open_since, self.watermarks, self.cdc_marks, self.clock())

    def _publish_watermark(self, low_ns: int, out: StageOutput) -> None:
        """The low watermark of the spans and CDC partitions owned, to every internal partition, when it is due
        (``streamer.runtime.low_watermark.Publication``)."""
        k = self.settings.kafka
        owned = sorted(f"{t}/{p}" for t, p in self.assignment if t == k.spans_topic or self.cdc_marks.owns((t, p)))
        if not owned or not self.broadcast_partitions:
            return
        if not self._published.due(low_ns, any(m.topic == k.accesses_topic for m in out.produce), self.clock()):
            return
        value = internal.encode_watermark(internal.Watermark(low_ns, tuple(owned)))
        out.produce += [Message(k.accesses_topic, None, value, partition=p) for p in range(self.broadcast_partitions)]

    def _retention(self, watermark_ns: int, out: StageOutput) -> None:
        """Raw spans older than the retention go; the cut-off never passes the wall clock (a skewed span can't
        push it into the live graph)."""
        every = s_to_ns(self.settings.windows.window_s)
        if watermark_ns - self._last_retention_ns >= every and watermark_ns > 0:
            self._last_retention_ns = watermark_ns
            now_ms = min(watermark_ns, self.clock()) / MS_NS
            out.expire_before_ms = now_ms - self.settings.graph_policy.span_retention_s * 1000


def _home(held: Sequence[Source]) -> str:
    """The input partition a trace came from (the first, when its spans came from several), of the input it held."""
    parts = [f"{tp[0]}/{tp[1]}" for tp, _ in held if isinstance(tp, tuple)]
    return min(parts) if parts else ""


__all__ = ["IngestStage", "ingest_inputs"]
