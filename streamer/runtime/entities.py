"""The entities stage (stage 2): per-row processing on the internal topic (co-partitioned by entity key), and the
relays of stage-1 processors to their stage-2 halves (the regression tests on every instance's statistics).

Event time here is the *upstream* low watermark: every stage-1 instance publishes, into every partition of the
internal topic, the event time up to which every trace of its input partitions has closed and its accesses have
been emitted (never this stage's own input times: row changes pass stage 1 at once while accesses wait for their
trace to close). It is kept per internal partition, from the watermark records read *in that partition*, and the
stage's event time is the minimum over its partitions (as a stream operator's is over its input channels): what a
watermark record promises (the accesses were emitted) is true of this instance's view only once it has read the
records ahead of it in the same partition, and an access may sit in another partition than the change it made
(an insert's scope and its new row). A partition taken over in a rebalance replays from its committed offset while
the others are live: it holds event time at zero until its replay reaches a watermark record, so that its replayed
row changes are not credited before the replayed accesses behind them were read (uncorrelated, their collisions
missed).

The credit rule: a row change waits (pinned, bounded) until event time has passed its commit time plus
``correlation.max_commit_delay_ms``; by then every trace that could have written it is known, and it is credited to
its writer by the strongest evidence (trace column, txId, the statement's values and time, commit order among tied
writers; see ``processors.correlation.engine``) or written uncorrelated and counted. Never guessed. A change left tied
among more writers than its row's changes so far (statements without their parameters on the spans) keeps waiting
for its row's next change, which commit order needs beside it: until event time has passed the latest commit its
writers could have made plus that delay (at most ``correlation.max_tie_wait_ms``); counted when the wait starts,
resolves or expires. The processors (the collision detector) see event time held back to the oldest change still
waiting, so that no row is judged before its commits are credited.

Containment (see :mod:`streamer.runtime.stage`): a row's changes whose crediting raises are written uncorrelated
(never guessed) and the credit is quarantined (counted against ``correlation``, logged with the changes' offsets);
a change whose graph row raises is quarantined (its pin released); a relay a processor refuses with anything but a
``ValueError`` is dead-lettered naming that processor, and the other receivers still get it. A record holding many
events (stage 1's packed accesses) is dead-lettered once for each reason, each event it refused counted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Sequence

from processors.api.component import Processor
from processors.correlation.engine import Correlation, RowCorrelator
from processors.correlation.keying import KeyInference
from processors.graph.rows import access_rows, change_row
from processors.model.events import Access, CdcOp, Commit, Keying, Relay, RowChange
from processors.model.units import MS_NS, ms_to_ns, s_to_ns
from processors.state.keyed import KeyedState
from processors.state.watermarks import UpstreamWatermarks
from streamer.config import CoreSettings
from streamer.decode.internal import Watermark
from streamer.decode.registry import Input, Record
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import StageOutput
from streamer.runtime.stage import Stage, log

PRUNE_MARGIN_NS = 10_000_000_000  # writes are kept at least this long after no change on time can be theirs
PendingKey = tuple[str, str, int, int]  # (entity, topic, partition, offset of the internal record): one change


def same_transaction(
    groups: dict[str, list[tuple[PendingKey, RowChange]]],
) -> dict[str, list[tuple[PendingKey, RowChange]]]:
    """The crediting groups, those holding changes of one transaction merged (in the first one's place)."""
    merged: dict[str, list[tuple[PendingKey, RowChange]]] = {}
    home: dict[str, str] = {}  # group -> the group it was merged into
    by_tx: dict[str, str] = {}  # transaction id -> its group
    for group, members in groups.items():
        into = next((by_tx[c.tx_id] for _, c in members if c.tx_id in by_tx), group)
        into = home.get(into, into)
        merged.setdefault(into, []).extend(members)
        home[group] = into
        for _, c in members:
            if c.tx_id:
                by_tx.setdefault(c.tx_id, into)
    return merged


def _no_default(key: PendingKey) -> RowChange:
    raise KeyError(f"a pending change is only ever put, never created empty: {key}")


class EntityStage(Stage):
    """Stage 2; see the module docstring."""

    name = "entities"

    def __init__(
        self,
        settings: CoreSettings,
        metrics: Metrics,
        clock: Callable[[], int],
        *,
        tracker: PinTracker | None = None,
        processors: Sequence[tuple[Processor, Sequence[str]]] = (),
    ) -> None:
        inputs = [Input("internal", "internal", topics=(settings.kafka.accesses_topic,))]
        super().__init__(settings, metrics, clock, inputs, tracker=tracker, processors=processors)
        c = settings.correlation
        self._expiry_ns = s_to_ns(settings.windows.upstream_expiry_s)
        self._upstream: dict[Hashable, UpstreamWatermarks] = {}  # per internal partition, from its own records
        self.credit_after_ns = ms_to_ns(c.max_commit_delay_ms + c.skew_ms)
        self._tie_wait_ns = ms_to_ns(c.max_tie_wait_ms)
        self._lag_ns = s_to_ns(settings.windows.max_cdc_lag_s)  # a write whose change has not come is kept this long
        self._future_ns = s_to_ns(settings.windows.max_future_skew_s)
        self.keying = KeyInference(max_traces=c.max_entities, telemetry=metrics.telemetry("keying"))
        self.correlator = RowCorrelator(trace_column=c.trace_column, skew_ms=c.skew_ms,
                                        max_commit_delay_ms=c.max_commit_delay_ms,
                                        history_per_entity=c.history_per_entity, max_entities=c.max_entities,
                                        history_per_table=c.history_per_table, max_bytes=c.max_history_bytes,
                                        clock_jitter_ms=c.clock_jitter_ms,
                                        telemetry=metrics.telemetry("correlation"))  # fmt: skip
        # Row changes waiting to be credited, one key per change; by entity, and by commit time (lazily pruned).
        self._pending: KeyedState[PendingKey, RowChange] = KeyedState(
            "pending", bound=c.max_pending_changes, new=_no_default, telemetry=metrics.telemetry("correlation"),
            events=self.tracker, on_evict=self._evicted, reason="max_pending_changes",
            max_bytes=c.max_pending_bytes, bytes_reason="max_pending_bytes",
        )  # fmt: skip
        self._waiting: dict[str, list[PendingKey]] = {}
        self._by_commit: list[tuple[int, PendingKey]] = []
        # Changes that came behind event time: when (event time), and those of them waiting since (a heap).
        self._arrived: dict[PendingKey, int] = {}
        self._late: list[tuple[int, PendingKey]] = []
        # Changes left tied among their writers, waiting for their row's (table's) other changes: the event time
        # until which they wait (a subset of ``_pending``: bounded with it).
        self._tied: dict[PendingKey, int] = {}
        self._out: StageOutput | None = None
        self._record: Record | None = None
        self.handlers = {"internal": self._internal}

    @property
    def pending_changes(self) -> int:
        """Row changes waiting to be credited (bounded by correlation.max_pending_changes)."""
        return len(self._pending)

    def upstream(self, tp: Hashable) -> UpstreamWatermarks:
        """The upstream progress read in internal partition ``tp``."""
        marks = self._upstream.get(tp)
        if marks is None:
            marks = self._upstream[tp] = UpstreamWatermarks(self._expiry_ns, self.clock)
        return marks

    def event_time(self) -> int:
        """The minimum over the partitions owned (or read from): a partition not read to a watermark yet is 0."""
        if any(tp not in self._upstream for tp in self.assignment):
            return 0
        return min((marks.current() for marks in self._upstream.values()), default=0)

    def _internal(self, record: Record, events: Sequence[Access | RowChange | Watermark | Relay],
                  out: StageOutput) -> None:  # fmt: skip
        self._record, self._out = record, out
        entity = (record.key or b"").decode("utf-8", "replace")
        part = f"{record.topic}/{record.partition}"  # the internal partition, as the processors' hooks name it
        limit = self.clock() + self._future_ns
        refused: set[str] = set()  # dead-lettered once for each reason (a packed record holds many accesses)
        for event in events:
            at = (event.watermark_ns if isinstance(event, Watermark) else event.end_ns if isinstance(event, Access)
                  else event.at_ns if isinstance(event, Relay) else event.commit_ts_ms * MS_NS)  # fmt: skip
            if at > limit:  # stage 1 never sends such times: a foreign or corrupt record must not stall event time
                self.metrics.telemetry("clock").drop("future_time")
                if "clock_skew" not in refused:
                    refused.add("clock_skew")
                    self._dead_letter(record, "clock_skew", f"event time {at} ns is beyond the wall clock", out)
                continue
            if isinstance(event, Relay):
                self._relay(record, part, event, out)
            elif isinstance(event, Watermark):
                marks = self.upstream((record.topic, record.partition))
                for partition in event.partitions:
                    marks.update(partition, event.watermark_ns)
            elif isinstance(event, Access):
                try:
                    self.correlator.add_access(event)
                    self.keying.add(event)
                except Exception as exc:  # the processors still get it; the record is dead-lettered once
                    if "correlation" in refused:
                        self.metrics.telemetry("correlation").drop(f"internal_error:{type(exc).__name__}")
                    else:
                        refused.add("correlation")
                        self.record_failed(record, "correlation", exc, out)
                for processor in self.processors:
                    self.call(processor, processor.on_access, event, part)
            else:
                key = (entity, record.topic, record.partition, record.offset)
                self._pending.put(key, event, len(record.value or b""))  # holds this record until credited
                self._waiting.setdefault(entity, []).append(key)
                heapq.heappush(self._by_commit, (event.commit_ts_ms * MS_NS, key))
                if (now := self.event_time()) > event.commit_ts_ms * MS_NS:  # late: see ``_credit``
                    self._arrived[key] = now

    def _relay(self, record: Record, part: str, relay: Relay, out: StageOutput) -> None:
        """A stage-1 processor's relay, to the processor of the same name here (pinned by what it feeds)."""
        receivers = [p for p in self.processors if p.name == relay.component]
        if not receivers:  # the component is off in this stage's config: nothing here wants it
            self.metrics.telemetry(self.name).drop("relay_unclaimed")
        for processor in receivers:
            try:
                processor.on_relay(relay, part)
            except ValueError as exc:
                self._dead_letter(record, "internal_invalid", f"relay to {relay.component}: {exc}"[:500], out,
                                  processor.name)  # fmt: skip
            except Exception as exc:
                self.record_failed(record, processor.name, exc, out)

    # ---- the credit rule ----------------------------------------------------------------------------------------

    def _credit(self, event_time_ns: int, out: StageOutput) -> None:
        """Credit every waiting change whose commit is ``credit_after_ns`` behind event time, row by row."""
        due: dict[str, list[PendingKey]] = {}
        while self._by_commit and self._by_commit[0][0] + self.credit_after_ns <= event_time_ns:
            _, key = heapq.heappop(self._by_commit)
            arrived = self._arrived.pop(key, None)
            if arrived is not None and arrived + self.credit_after_ns > event_time_ns and key in self._pending:
                heapq.heappush(self._late, (arrived, key))  # the credit delay from its arrival first (see below)
            elif key in self._pending and key not in self._tied:
                due.setdefault(key[0], []).append(key)
        # A change that came behind event time (a backlog after an outage: every input idle, event time caught up
        # with the wall clock) passed stage 1 at once, while its writers' traces, late as well, still waited there to
        # close: their accesses follow it. It is due the credit delay after its arrival instead.
        while self._late and self._late[0][0] + self.credit_after_ns <= event_time_ns:
            _, key = heapq.heappop(self._late)
            if key in self._pending and key not in self._tied:
                due.setdefault(key[0], []).append(key)
        self._retry_tied(due, event_time_ns)
        groups: dict[str, list[tuple[PendingKey, RowChange]]] = {}
        for entity, keys in due.items():
            for key in keys:
                change = self._pending.get(key)
                if change is not None:  # a row's changes together; inserts of one table together (see below)
                    group = f"{change.table}\0insert" if change.op is CdcOp.CREATE else entity
                    groups.setdefault(group, []).append((key, change))
        # Inserts whose key the database assigned are matched against the table's predicate inserts: k new rows
        # that tie over the same k writers are credited together (each writer made one of them). Changes of other
        # rows that tied over writers no change of their own row could settle (statements whose keys were not on
        # their spans) are credited again together, per table: k rows over k writers, a transaction's rows in its
        # order. A group whose crediting raises is written uncorrelated (never guessed); the others are credited.
        # A change still tied waits (pinned, holding event time) while a tied writer may still have made another
        # change of its row: commit order needs the row's changes and their writers together (``_still_tied``).
        tied: dict[str, list[tuple[PendingKey, RowChange]]] = {}
        until: dict[PendingKey, int] = {}
        settled = False  # some change credited to a writer in this pass
        for group, members in groups.items():
            credited = self._credit_group(group, members)
            unresolved = self.correlator.unresolved_until
            for key, change, correlation in credited:
                if correlation is None and id(change) in unresolved:
                    tied.setdefault(change.table, []).append((key, change))
                    until[key] = self._tied.get(key, min(unresolved[id(change)] + self.credit_after_ns,
                                                         event_time_ns + self._tie_wait_ns))  # fmt: skip
                else:
                    settled = settled or correlation is not None
                    self._settle(key, change, correlation, out)
        # Credited again, together: a lone change too when this pass credited some writer, which is no longer the
        # candidate of another row's change when its statement writes one row (rows are credited one by one, in
        # commit order, so an earlier row's change tied with a writer a later row's change then settled).
        for group, members in same_transaction(tied).items():
            again = len(members) > 1 or settled
            pooled = self._credit_group(group, members) if again else [(k, c, None) for k, c in members]
            unresolved = self.correlator.unresolved_until if again else {id(c): 0 for _, c in members}
            for key, change, correlation in pooled:
                if not self._still_tied(key, correlation is None and id(change) in unresolved, until[key],
                                        event_time_ns):  # fmt: skip
                    self._settle(key, change, correlation, out)
        for entity in due:
            waiting = [k for k in self._waiting.get(entity, []) if k in self._pending]
            if waiting:
                self._waiting[entity] = waiting
            else:
                self._waiting.pop(entity, None)

    def _retry_tied(self, due: dict[str, list[PendingKey]], event_time_ns: int) -> None:
        """Into ``due``: the tied changes of a row or table with a change due now, and those whose wait is over."""
        tables = {c.table for keys in due.values() for k in keys if (c := self._pending.get(k)) is not None}
        for key, until in list(self._tied.items()):
            change = self._pending.get(key)
            if change is None:
                del self._tied[key]
            elif until <= event_time_ns or key[0] in due or change.table in tables:
                due.setdefault(key[0], []).append(key)

    def _still_tied(self, key: PendingKey, tied: bool, until: int, event_time_ns: int) -> bool:
        """Whether a change keeps waiting: tied among its writers, and event time not past the latest commit any of
        them could have made plus the credit delay (every change of theirs is due by then). Counted when it starts
        waiting and when its wait ends unresolved (then it is written uncorrelated, never guessed)."""
        if not tied or event_time_ns >= until:
            if tied and key in self._tied:
                self.correlator.telemetry.count("tie_wait_expired")
            return False
        if key not in self._tied:
            self.correlator.telemetry.count("tie_waits")
        self._tied[key] = until
        return True

    def _credit_group(self, group: str, members: list[tuple[PendingKey, RowChange]]) -> list[
            tuple[PendingKey, RowChange, Correlation | None]]:  # fmt: skip
        """``correlate_many`` over one group of waiting changes; all uncorrelated (quarantined) when it raises."""
        by_id = {id(change): key for key, change in members}
        try:
            credited = self.correlator.correlate_many([c for _, c in members])
        except Exception as exc:  # written uncorrelated, never guessed
            what = f"credit of {len(members)} change(s) of {group.replace(chr(0), ' ')}"
            self.quarantine("correlation", what, exc, [("pending", key) for key, _ in members])
            self.correlator.unresolved, self.correlator.unresolved_until = [], {}
            credited = [(change, None) for _, change in members]
        return [(by_id[id(change)], change, correlation) for change, correlation in credited]

    def _settle(self, key: PendingKey, change: RowChange, correlation: Correlation | None, out: StageOutput) -> None:
        """A credited change: what it feeds holds the input it held; then it stops waiting."""
        self.tracker.inherit("pending", key)
        self._resolve(key, change, correlation, out)
        self._pending.discard(key)
        if self._tied.pop(key, None) is not None and correlation is not None:
            self.correlator.telemetry.count("tie_wait_resolved")  # its row's next change came: commit order decided
        self.tracker.feeding(None)

    def _resolve(self, key: PendingKey, change: RowChange, correlation: Correlation | None, out: StageOutput) -> None:
        """``_resolved``, or the change quarantined when that raises (its rows taken back; the caller releases it)."""
        mark = out.mark()
        try:
            self._resolved(key, change, correlation, out)
        except Exception as exc:
            out.rollback(mark)
            self.quarantine("correlation", f"change lsn {change.lsn} of {key[0]}", exc, [("pending", key)])

    def _resolved(self, key: PendingKey, change: RowChange, correlation: Correlation | None, out: StageOutput) -> None:
        """A change whose writer is known (or will never be): graph row, metric, and evidence for the processors
        (with the internal partition the change came from)."""
        entity, part = key[0], f"{key[1]}/{key[2]}"
        self.metrics.correlated.labels(correlation.strength if correlation else "none").inc()
        out.graph.changes.append(change_row(change, entity, correlation))
        inferred = self.keying.credited(change, correlation)  # what the credit proves of keys not on their spans
        access_rows([a for a in inferred if a.keying == Keying.BY_TRACE], out.graph)  # (a write's edge: its change)
        for access in inferred:
            for processor in self.processors:
                self.call(processor, processor.on_access, access, part)
        a = correlation.access if correlation else None
        commit = (Commit(change, a.trace_id, a.span_id, correlation.strength, correlation.skew_ms)
                  if a is not None and correlation is not None else Commit(change))  # fmt: skip
        for processor in self.processors:
            self.call(processor, processor.on_commit, entity, commit, part)

    def _evicted(self, key: PendingKey, change: RowChange) -> None:
        """The pending bound evicted a change (counted): it is written uncorrelated rather than lost."""
        waiting = self._waiting.get(key[0], [])
        if key in waiting:
            waiting.remove(key)
        self._tied.pop(key, None)
        assert self._out is not None
        self.tracker.inherit("pending", key)
        self._resolve(key, change, None, self._out)
        self.tracker.feeding(self._record.source if self._record is not None else None)

    def _oldest_waiting_ns(self) -> int | None:
        while self._by_commit and self._by_commit[0][1] not in self._pending:
            self._arrived.pop(heapq.heappop(self._by_commit)[1], None)
        self._late = [(at, k) for at, k in self._late if k in self._pending]  # (a heap still: a filtered heap is one)
        held = [c.commit_ts_ms * MS_NS for k in [*self._tied, *(k for _, k in self._late)]
                if (c := self._pending.get(k)) is not None]  # fmt: skip
        return min([*held, *(self._by_commit[0][:1] if self._by_commit else ())], default=None)

    # ---- event time -------------------------------------------------------------------------------------------

    def on_batch_end(self, watermark_ns: int, out: StageOutput) -> None:
        self._record, self._out = None, out
        self._credit(watermark_ns, out)
        oldest = self._oldest_waiting_ns()
        held = watermark_ns if oldest is None else min(watermark_ns, oldest - 1)
        if held > 0:  # writes no waiting (or later) change can be credited to any more
            cut = held - 2 * self.credit_after_ns
            self.correlator.prune(cut - PRUNE_MARGIN_NS, cut - max(PRUNE_MARGIN_NS, self._lag_ns))
            self.keying.prune(cut - max(PRUNE_MARGIN_NS, self._lag_ns))  # (a write may wait for its change that long)
        self.correlator.telemetry.gauge("rows", len(self.correlator))
        self.keying.telemetry.gauge("traces", len(self.keying))
        self.correlator.telemetry.gauge("pending_changes", len(self._pending))
        self.correlator.telemetry.gauge("history_bytes", self.correlator.bytes)
        self.correlator.telemetry.gauge("pending_bytes", self._pending.bytes)
        stray = self.emit(held, None, out).relays
        if stray:  # relays go from stage 1 to stage 2: one a stage-2 processor emits has nowhere to go
            self.metrics.telemetry(self.name).drop("relay_from_stage_2", len(stray))
            if self._failures.add(("entities", "relay", "stage_2")):
                log.error("relay.undeliverable", stage=self.name, components=sorted({r.component for r in stray}))
        self._out = None

    def forget(self, tp: Hashable) -> None:
        """A revoked partition's waiting changes and event time go (its next owner replays them), then its pins."""
        self._upstream.pop(tp, None)
        for entity, keys in list(self._waiting.items()):
            for key in [k for k in keys if (k[1], k[2]) == tp]:
                self._pending.discard(key)
                self._tied.pop(key, None)
                keys.remove(key)
            if not keys:
                del self._waiting[entity]
        super().forget(tp)
