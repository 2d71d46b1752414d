"""Stage 2: per-entity processing on the internal topic (co-partitioned by entity key).

Correlates each committed row change with the span access that made it and writes the commit facts to the graph;
feeds accesses and commits to the collision detector and turns its findings into incidents.
A row change often arrives before its trace has closed in stage 1, so it waits (bounded, pinned) until an access
for the same entity arrives or the stage's watermark passes ``commit time + correlation.wait_s``; then it is
written uncorrelated and counted. Never guessed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

from processors.collisions import CollisionDetector, Commit
from processors.correlation import Correlation, RowCorrelator
from processors.graph_rows import change_row
from processors.incidents import incident_event
from processors.invariants import compile_invariants
from processors.pins import OffsetPins, Source
from processors.watermarks import Watermarks
from streamer import wire
from streamer.config import Settings
from streamer.events import Access, RowChange
from streamer.runtime.metrics import Metrics
from streamer.runtime.records import Record, StageOutput, dead_letter

NS = 1_000_000_000


class EntityStage:
    def __init__(self, settings: Settings, metrics: Metrics, clock: Callable[[], int]) -> None:
        c = settings.correlation
        w = settings.windows
        self.settings = settings
        self.metrics = metrics
        self.pins = OffsetPins()
        self.watermarks = Watermarks(int(w.allowed_lateness_s * NS), int(w.idle_s * NS), clock)
        self.correlator = RowCorrelator(
            trace_column=c.trace_column,
            skew_ms=c.skew_ms,
            max_commit_delay_ms=c.max_commit_delay_ms,
            history_per_entity=c.history_per_entity,
            max_entities=c.max_entities,
        )
        k = settings.collisions
        self.detector = CollisionDetector(
            window_ns=int(k.window_s * NS),
            settle_ns=int(k.settle_s * NS),
            invariants=compile_invariants(k.invariants),
            history_per_entity=k.history_per_entity,
            max_entities=k.max_entities,
        )
        # entity key -> [(change, source)], oldest entity first; bounded by max_pending_changes in total
        self._pending: OrderedDict[str, list[tuple[RowChange, Source]]] = OrderedDict()
        self._pending_count = 0

    @property
    def pending_changes(self) -> int:
        """Row changes waiting for the access that made them (bounded by correlation.max_pending_changes)."""
        return self._pending_count

    @property
    def topics_pattern(self) -> str:
        return f"^{self.settings.kafka.accesses_topic.replace('.', '[.]')}$"

    def process(self, records: Iterable[Record]) -> StageOutput:
        out = StageOutput()
        for record in records:
            self.metrics.consumed.labels(record.topic).inc()
            try:
                event = wire.decode(record.value or b"")
            except (ValueError, KeyError, TypeError) as exc:
                self.metrics.dlq.labels("internal_invalid").inc()
                out.produce.append(dead_letter(record, self.settings.kafka.dlq_topic, "internal_invalid", str(exc)))
                continue
            tp = (record.topic, record.partition)
            entity = (record.key or b"").decode("utf-8", "replace")
            if isinstance(event, Access):
                self.watermarks.observe(tp, event.end_ns)
                self.correlator.add_access(event)
                self.pins.pin([record.source])
                self.detector.on_access(event, record.source)
                self._retry(entity, out)
            else:
                self.watermarks.observe(tp, event.commit_ts_ms * 1_000_000)
                self._change(entity, event, record.source, out)
        self._expire(out)
        watermark = self.watermarks.current()
        judgement = self.detector.close_until(watermark)
        out.release.extend(judgement.released)  # type: ignore[arg-type]
        out.incidents.extend(incident_event(c, watermark) for c in judgement.collisions)
        self.metrics.watermark.labels("entities").set(watermark / NS)
        self.metrics.pinned_offsets.labels("entities").set(self.pins.total())
        return out

    def _change(self, entity: str, change: RowChange, source: Source, out: StageOutput) -> None:
        correlation = self.correlator.correlate(change)
        if correlation is not None:
            self._resolved(entity, change, source, correlation, out)
            return
        if self._pending_count >= self.settings.correlation.max_pending_changes:
            old_entity, oldest = self._pending.popitem(last=False)
            self._pending_count -= len(oldest)
            for old, old_source in oldest:
                self.metrics.dropped.labels("correlation", "pending_bound").inc()
                self._resolved(old_entity, old, old_source, None, out)
                out.release.append(old_source)
        self._pending.setdefault(entity, []).append((change, source))
        self._pending_count += 1
        self.pins.pin([source])

    def _resolved(
        self, entity: str, change: RowChange, source: Source, correlation: Correlation | None, out: StageOutput
    ) -> None:
        """A change whose writer is known (or will never be): graph row, metric, and evidence for the detector."""
        self.metrics.correlated.labels(correlation.strength if correlation else "none").inc()
        out.graph.changes.append(change_row(change, entity, correlation))
        commit = (
            Commit(
                change,
                correlation.access.trace_id,
                correlation.access.span_id,
                correlation.strength,
                correlation.skew_ms,
            )
            if correlation
            else Commit(change)
        )
        self.pins.pin([source])
        self.detector.on_commit(entity, commit, source)

    def _retry(self, entity: str, out: StageOutput) -> None:
        waiting = self._pending.get(entity)
        if not waiting:
            return
        still = []
        for change, source in waiting:
            correlation = self.correlator.correlate(change)
            if correlation is None:
                still.append((change, source))
                continue
            self._resolved(entity, change, source, correlation, out)
            out.release.append(source)  # the pending pin; the detector holds its own until judged
        self._pending_count -= len(waiting) - len(still)
        if still:
            self._pending[entity] = still
        else:
            del self._pending[entity]

    def _expire(self, out: StageOutput) -> None:
        horizon_ms = self.watermarks.current() / 1e6 - self.settings.correlation.wait_s * 1000
        for entity in list(self._pending):
            waiting = self._pending[entity]
            keep = [(c, s) for c, s in waiting if c.commit_ts_ms >= horizon_ms]
            for change, source in waiting:
                if change.commit_ts_ms < horizon_ms:
                    self._resolved(entity, change, source, None, out)
                    out.release.append(source)
            self._pending_count -= len(waiting) - len(keep)
            if keep:
                self._pending[entity] = keep
            else:
                del self._pending[entity]

    def release(self, sources: Iterable[Source]) -> None:
        self.pins.release(sources)
        self.metrics.pinned_offsets.labels("entities").set(self.pins.total())

    def committable(self, tp: Hashable, position: int) -> int:
        return self.pins.committable(tp, position)

    def forget(self, tp: Hashable) -> None:
        self.pins.forget(tp)
        self.watermarks.forget(tp)
        for entity in list(self._pending):
            kept = [(c, s) for c, s in self._pending[entity] if s[0] != tp]
            self._pending_count -= len(self._pending[entity]) - len(kept)
            if kept:
                self._pending[entity] = kept
            else:
                del self._pending[entity]
