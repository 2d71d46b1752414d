"""Stage 1: decode spans, logs and row changes; assemble traces; aggregate windows; emit graph rows.

``IngestStage.process(records)`` is synchronous and transport-free: it returns a :class:`StageOutput` (graph rows,
messages to produce, pins to release) and the runtime performs it in commit order. Accesses (the reads and writes
of rows that DB spans made) and row changes go to the internal topic keyed by entity, for stage 2.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import replace

from pydantic import ValidationError

from processors.contracts import ProofContract
from processors.graph_rows import trace_rows, window_rows
from processors.pins import OffsetPins, Source
from processors.sql_access import SqlAccessExtractor, identity_entity_key
from processors.traces import ClosedTrace, TraceAssembler
from processors.watermarks import Watermarks
from processors.windows import CallWindows
from streamer import wire
from streamer.config import Settings
from streamer.decode import (
    DecodeError,
    DecodeOptions,
    DecodeStats,
    decode_logs_json,
    decode_logs_proto,
    decode_row_change,
    decode_traces_json,
    decode_traces_proto,
)
from streamer.events import Access, RowChange, Span
from streamer.runtime.metrics import Metrics
from streamer.runtime.proofs import ProofDesk
from streamer.runtime.records import Outbound, Record, StageOutput, dead_letter
from streamer.schemas import IncidentEvent

NS = 1_000_000_000


def _function_of(span: Span, by_id: dict[str, Span]) -> tuple[str, str]:
    """code.function.name / code.file.path of the span or its nearest ancestor that has them."""
    seen = 0
    node: Span | None = span
    while node is not None and seen < 64:
        if node.code_function:
            return node.code_function, node.code_file
        node = by_id.get(node.parent_id)
        seen += 1
    return "", ""


def _with_request(trace: ClosedTrace, accesses: list[Access]) -> list[Access]:
    """Stamp each access with its request: route, interval and outcome (what the collision detector judges)."""
    root = trace.root
    exception = next((s.exception_type for s in trace.spans if s.exception_type), "")
    links = tuple(sorted({t for s in trace.spans for t in s.links}))
    return [
        replace(
            a,
            route=root.route or root.name,
            request_start_ns=root.start_ns,
            request_end_ns=max(root.end_ns, trace.end_ns),
            trace_error=any(s.is_error for s in trace.spans),
            trace_exception=exception,
            trace_status=root.http_status,
            links=links,
        )
        for a in accesses
    ]


class IngestStage:
    """Stage 1 of the pipeline; see the module docstring."""

    def __init__(self, settings: Settings, metrics: Metrics, clock: Callable[[], int]) -> None:
        w = settings.windows
        self.settings = settings
        self.metrics = metrics
        self.pins = OffsetPins()
        self.watermarks = Watermarks(int(w.allowed_lateness_s * NS), int(w.idle_s * NS), clock)
        self.traces = TraceAssembler(int(w.trace_gap_s * NS), w.max_open_traces, w.max_spans_per_trace)
        self.windows = CallWindows(int(w.window_s * NS), int(w.trace_gap_s * NS))
        sql = settings.sql
        self.extractor = SqlAccessExtractor(
            key_columns=sql.key_columns or None,
            version_columns=tuple(sql.version_columns),
            insert_identity=sql.insert_identity or None,
            cache_size=sql.statement_cache,
        )
        d = settings.decode
        self.decode_options = DecodeOptions(
            tx_id_attribute=d.tx_id_attribute,
            row_version_attribute=d.row_version_attribute,
            idempotency_key_attribute=d.idempotency_key_attribute,
            max_attribute_bytes=d.max_attribute_bytes,
        )
        k = settings.kafka
        self._decode_spans = decode_traces_json if k.span_encoding == "otlp_json" else decode_traces_proto
        self._decode_logs = decode_logs_json if k.span_encoding == "otlp_json" else decode_logs_proto
        self._cdc = re.compile(k.cdc_pattern)
        self.proofs = ProofDesk(settings)
        self._last_retention_ns = 0

    @property
    def topics_pattern(self) -> str:
        k = self.settings.kafka
        own = "|".join(re.escape(t) for t in (k.spans_topic, k.logs_topic, k.contracts_topic, k.incidents_topic))
        return f"^(?:{own})$|{k.cdc_pattern}"

    # ---- per batch -------------------------------------------------------------------------------------------

    def process(self, records: Iterable[Record]) -> StageOutput:
        out = StageOutput()
        forced: list[ClosedTrace] = []
        k = self.settings.kafka
        self.proofs.drain(out)
        for record in records:
            self.metrics.consumed.labels(record.topic).inc()
            try:
                if record.topic == k.spans_topic:
                    forced += self._spans(record)
                elif record.topic == k.logs_topic:
                    self._logs(record)
                elif record.topic == k.contracts_topic:
                    self._contract(record)
                elif record.topic == k.incidents_topic:
                    self._incident(record)
                elif self._cdc.search(record.topic):
                    self._row_change(record, out)
            except DecodeError as exc:
                self.metrics.dlq.labels(exc.reason).inc()
                self.metrics.dropped.labels("decode", exc.reason).inc()
                out.produce.append(dead_letter(record, k.dlq_topic, exc.reason, str(exc)))
        watermark = self.watermarks.current()
        for trace in forced + self.traces.close_until(watermark):
            self._closed_trace(trace, out)
        open_since = self.traces.oldest_start()
        for window in self.windows.close_until(watermark, open_since):
            window_rows(window, out.graph)
            out.release.extend(window.sources)
        self.proofs.close_until(watermark, open_since, out)
        self._retention(watermark, out)
        self._gauges(watermark)
        return out

    def _spans(self, record: Record) -> list[ClosedTrace]:
        if not record.value:
            raise DecodeError("empty_value", "span message has no value")
        stats = DecodeStats()
        spans = self._decode_spans(record.value, self.decode_options, stats)
        if stats.truncated_attributes and self.settings.decode.oversize == "dlq":
            raise DecodeError(
                "oversize_attribute",
                f"{stats.truncated_attributes} attribute(s) over {self.decode_options.max_attribute_bytes} bytes",
            )
        self.metrics.decoded.labels("span").inc(len(spans))
        if not spans:
            return []
        tp = (record.topic, record.partition)
        if self.watermarks.observe(tp, max(s.end_ns for s in spans)):
            self.metrics.late.labels("span").inc(len(spans))
        forced, new_refs = self.traces.add(spans, record.source)
        self.pins.pin([record.source] * new_refs)
        return forced

    def _logs(self, record: Record) -> None:
        if not record.value:
            raise DecodeError("empty_value", "log message has no value")
        logs = self._decode_logs(record.value, self.decode_options, None)
        self.metrics.decoded.labels("log").inc(len(logs))
        for log_record in logs:
            self.proofs.on_log(log_record)

    def _contract(self, record: Record) -> None:
        try:
            contract = ProofContract.model_validate_json(record.value or b"")
        except ValidationError as exc:
            raise DecodeError("contract_invalid", str(exc)[:500]) from exc
        self.proofs.inbox.append(contract)

    def _incident(self, record: Record) -> None:
        """Stage 2's incidents feed the proof judge (collisions per build) and get their contracts."""
        try:
            raw = json.loads(record.value or b"")
            if not isinstance(raw, dict) or raw.get("kind") != "incident":
                return  # regressions (ours) and newer kinds share the topic
            self.proofs.inbox.append(IncidentEvent.model_validate(raw))
        except (ValueError, ValidationError) as exc:
            raise DecodeError("incident_invalid", str(exc)[:500]) from exc

    def _row_change(self, record: Record, out: StageOutput) -> None:
        change = decode_row_change(record.key, record.value, topic=record.topic, partition=record.partition,
                                   offset=record.offset)  # fmt: skip
        if change is None:
            self.metrics.decoded.labels("tombstone").inc()
            return
        self.metrics.decoded.labels("row_change").inc()
        # Row changes do not move stage 1's watermark: it closes traces and windows, which row changes do not
        # feed, and Debezium's delivery delay would hold trace closing back. Stage 2 judges their lateness.
        key = self._routing_key(change)
        out.produce.append(Outbound(self.settings.kafka.accesses_topic, key.encode(), wire.encode_row_change(change)))

    def _routing_key(self, change: RowChange) -> str:
        """The entity key stage 2 partitions by; inserts keyed by identity columns route like their statements."""
        bare = change.table.rsplit(".", 1)[-1]
        identity = self.settings.sql.insert_identity.get(bare)
        image = change.after or change.before or {}
        if identity and all(c in image for c in identity):
            return identity_entity_key(bare, identity, [image[c] for c in identity])
        return change.entity_key

    def _closed_trace(self, trace: ClosedTrace, out: StageOutput) -> None:
        by_id = {s.span_id: s for s in trace.spans}
        accesses: list[Access] = []
        for span in trace.spans:
            if span.db is not None:
                function, file = _function_of(span, by_id)
                accesses.extend(self.extractor.accesses(span, function=function, file=file))
        if accesses:
            accesses = _with_request(trace, accesses)
        trace_rows(trace, accesses, self.settings.graph_policy.detail, out.graph)
        topic = self.settings.kafka.accesses_topic
        out.produce.extend(Outbound(topic, a.entity.encode(), wire.encode_access(a)) for a in accesses)
        if trace.late:
            self.metrics.late.labels("trace").inc()
        new_for_window = self.windows.add(trace)
        if new_for_window is None:
            self.metrics.dropped.labels("windows", "late_trace").inc()
        else:
            self.pins.pin(new_for_window)
        new_for_stats = self.proofs.on_trace(trace)
        if new_for_stats is None:
            self.metrics.dropped.labels("stats", "late_trace").inc()
        else:
            self.pins.pin(new_for_stats)
        if trace.forced:
            self.metrics.dropped.labels("traces", "forced_close").inc()
        out.release.extend(trace.sources)

    def _retention(self, watermark: int, out: StageOutput) -> None:
        every = int(self.settings.windows.window_s * NS)
        if watermark - self._last_retention_ns >= every and watermark > 0:
            self._last_retention_ns = watermark
            out.expire_before_ms = (watermark / 1e6) - self.settings.graph_policy.span_retention_s * 1000

    def _gauges(self, watermark: int) -> None:
        m = self.metrics
        m.open_traces.set(len(self.traces))
        m.open_windows.set(len(self.windows))
        m.watermark.labels("ingest").set(watermark / NS)
        m.pinned_offsets.labels("ingest").set(self.pins.total())
        counters = self.traces.counters
        for reason in ("dropped_spans",):
            if counters[reason]:
                m.dropped.labels("traces", reason).inc(counters[reason])
                counters[reason] = 0

    # ---- runtime hooks ----------------------------------------------------------------------------------------

    def release(self, sources: Iterable[Source]) -> None:
        self.pins.release(sources)
        self.metrics.pinned_offsets.labels("ingest").set(self.pins.total())

    def committable(self, tp: Hashable, position: int) -> int:
        return self.pins.committable(tp, position)

    def forget(self, tp: Hashable) -> None:
        self.pins.forget(tp)
        self.watermarks.forget(tp)
        self.traces.forget_source(tp)
        self.windows.forget_source(tp)
