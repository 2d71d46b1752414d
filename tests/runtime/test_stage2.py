"""EntityStage without engines: internal Access, RowChange and Watermark records in; credited changes and pins out.

Event time here is only what upstream (stage 1) publishes: ``Pipe.upstream(at_s)`` sends its low watermark.
A change is credited once that has passed its commit time plus max_commit_delay + skew (2.005 s by default).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.api.component import Emit, Processor
from processors.model.events import Access, CdcOp, DbOperation, LockMode, Relay, RowChange
from streamer import config
from streamer.components import default
from streamer.decode import internal as wire
from streamer.runtime.context import stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Record, StageOutput
from tests.fake_clock import FakeClock

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
TOPIC = "trace-repro.accesses"
TP = (TOPIC, 0)
ENV = {"TRACE_REPRO_WINDOWS__IDLE_S": "30"}
CREDIT_S = 2.005  # max_commit_delay_ms + skew_ms
_span_ids = itertools.count(1)


class Pipe:
    """An EntityStage fed Records at consecutive offsets, with a fake clock and its own metrics."""

    def __init__(self, **env: str) -> None:
        self.settings = config.load(None, env={**ENV, **env})
        assert self.settings.kafka.accesses_topic == TOPIC
        self.clock = FakeClock(T0)
        self.metrics = Metrics()
        tracker = PinTracker()
        processors = stage_processors(self.settings, self.metrics, self.clock, "entities", tracker,
                                      default().factories)  # fmt: skip
        self.stage = EntityStage(self.settings, self.metrics, self.clock, tracker=tracker, processors=processors)
        self.positions: defaultdict[tuple[str, int], int] = defaultdict(int)

    def record(self, key: str, value: bytes, partition: int = 0) -> Record:
        offset = self.positions[(TOPIC, partition)]
        self.positions[(TOPIC, partition)] += 1
        return Record(TOPIC, partition, offset, key.encode(), value)

    def send(self, *events: Access | RowChange, partition: int = 0) -> StageOutput:
        records = []
        for e in events:
            if isinstance(e, Access):
                records.append(self.record(e.entity, wire.encode_access(e), partition))
            else:
                records.append(self.record(e.entity_key, wire.encode_row_change(e), partition))
        return self.stage.process(records)

    def upstream(self, at_s: float, partition: int = 0) -> StageOutput:
        """Stage 1 says: every trace of otlp_spans/0 before T0 + at_s has closed and its accesses were sent."""
        self.clock.now = max(self.clock.now, T0 + int(at_s * S))  # upstream never reports a time ahead of the clock
        value = wire.encode_watermark(wire.Watermark(T0 + int(at_s * S), ("otlp_spans/0",)))
        return self.stage.process([self.record("", value, partition)])

    def committable(self, partition: int = 0) -> int:
        tp = (TOPIC, partition)
        return self.stage.committable(tp, self.positions[tp])

    def pending(self) -> int:
        """How many row changes wait for their access."""
        return self.stage.pending_changes

    def drain(self, partition: int = 0) -> StageOutput:
        """Upstream far ahead: everything is credited and judged; release what the stage gives back."""
        out = self.upstream(10_000, partition)
        self.stage.release(out.release)
        return out

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def access(
    entity: str = "orders:8812", *, end_s: float = 1.0, tx: str = "771", op: DbOperation = DbOperation.WRITE
) -> Access:
    end = T0 + int(end_s * S)
    return Access(
        entity=entity,
        table=entity.split(":")[0],
        operation=op,
        lock=LockMode.NONE,
        trace_id="ab" * 16,
        span_id=f"{next(_span_ids):016x}",
        service="checkout",
        version="1.0.0",
        start_ns=end - 5 * MS,
        end_ns=end,
        statement="UPDATE orders SET status = %s WHERE id = %s",
        params=("paid", int(entity.split(":")[1])),
        set_values=(("status", "paid"),),
        tx_id=tx,
    )


def change(key: int = 8812, *, commit_s: float = 1.0, tx: str = "771") -> RowChange:
    return RowChange(
        table="public.orders",
        op=CdcOp.UPDATE,
        key=(("id", key),),
        before={"id": key, "status": "pending"},
        after={"id": key, "status": "paid"},
        commit_ts_ms=(T0 + int(commit_s * S)) // MS,
        ts_ms=(T0 + int(commit_s * S)) // MS + 50,
        lsn=1000 + key,
        tx_id=tx,
    )


def test_change_is_credited_only_once_upstream_has_passed_its_commit_plus_the_delay() -> None:
    """A change waits (pinned) although its writer's access is already there: every trace that could have written
    it is known only when upstream has passed commit + delay; then it is credited and its pin released."""
    p = Pipe()
    a = access(end_s=0.999)
    p.send(a)  # offset 0
    out = p.send(change(commit_s=1.0))  # offset 1
    assert out.graph.changes == [] and p.pending() == 1
    out = p.upstream(1.0 + CREDIT_S - 0.001)  # offset 2: not yet
    assert out.graph.changes == [] and p.committable() == 0
    out = p.upstream(1.0 + CREDIT_S)  # offset 3
    [row] = out.graph.changes
    assert (row["entity"], row["span"], row["strength"], row["tx"]) == ("orders:8812", a.span_id, "tx_id", "771")
    assert (TP, 1) in out.release
    assert p.metric("trace_repro_row_changes_correlated_total", strength="tx_id") == 1
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 5


def test_arrival_order_of_change_and_access_does_not_matter() -> None:
    """The access arriving after its change gets the same credit as one that arrived before it."""
    p = Pipe()
    p.send(change(commit_s=1.0))
    a = access(end_s=0.999)
    p.send(a)
    out = p.upstream(5)
    assert [(r["span"], r["strength"]) for r in out.graph.changes] == [(a.span_id, "tx_id")]


def test_a_change_arriving_behind_event_time_waits_for_its_writers_traces_to_close() -> None:
    """Event time ran ahead (every input idle, caught up with the wall clock) when a backlog arrives: a collector's
    buffer after a broker outage. The row change passes stage 1 at once while its writer's trace waits to close, so
    it reaches stage 2 first, its commit long behind event time; it waits the credit delay from its arrival, for the
    writer's access to come, instead of being credited to nobody at the next batch end."""
    p = Pipe()
    p.upstream(60.0)
    out = p.send(change(commit_s=1.0))  # 59 s behind event time
    assert out.graph.changes == [] and p.pending() == 1
    out = p.upstream(60.5)
    assert out.graph.changes == [] and p.pending() == 1
    a = access(end_s=0.999)  # the trace closed late in stage 1: its access follows the change
    p.send(a)
    out = p.upstream(60.0 + CREDIT_S)
    [row] = out.graph.changes
    assert (row["span"], row["strength"]) == (a.span_id, "tx_id")


def test_a_partition_taken_over_is_credited_by_its_own_replay_not_by_the_others_progress() -> None:
    """Partition 0 is live and far ahead; partition 1 arrives in a rebalance and replays from its committed offset:
    a change, then the access that made it (emitted when its trace closed), then the watermark that covers it.
    Judged by partition 0's progress the change would be credited before the access was read (uncorrelated, its
    collision missed); by its own partition's it waits for the access."""
    p = Pipe()
    p.stage.assign([TP])
    p.upstream(100.0, partition=0)
    p.stage.assign([(TOPIC, 1)])
    assert p.stage.event_time() == 0  # the new partition holds event time until its replay reaches a watermark
    out = p.send(change(commit_s=1.0), partition=1)
    assert out.graph.changes == [] and p.pending() == 1
    a = access(end_s=0.999)
    p.send(a, partition=1)
    out = p.upstream(1.0 + CREDIT_S, partition=1)
    assert [(r["span"], r["strength"]) for r in out.graph.changes] == [(a.span_id, "tx_id")]
    assert p.stage.event_time() == T0 + int((1.0 + CREDIT_S) * S)
    p.stage.forget((TOPIC, 1))  # revoked again: the minimum is partition 0's once more
    assert p.stage.event_time() == T0 + 100 * S


def test_a_change_waits_for_every_partition_to_pass_it() -> None:
    """An access can sit in another internal partition than the change it made (an insert's table scope and its new
    row): a watermark read in the change's partition says the access was emitted, not that this instance has read
    it. The change waits until every partition's own watermark has passed it."""
    p = Pipe()
    p.stage.assign([TP, (TOPIC, 1)])
    p.send(change(commit_s=1.0), partition=1)
    out = p.upstream(5, partition=1)  # read ahead in the change's partition; partition 0 not read that far yet
    assert out.graph.changes == [] and p.pending() == 1
    a = access(end_s=0.999)
    p.send(a, partition=0)
    out = p.upstream(5, partition=0)
    assert [(r["span"], r["strength"]) for r in out.graph.changes] == [(a.span_id, "tx_id")]


def test_event_time_comes_only_from_upstream() -> None:
    """Accesses and changes, however late their times, never move this stage's event time: no credit without
    upstream, and the idle clock does not replace it."""
    p = Pipe()
    p.send(change(commit_s=1.0), access("orders:1", end_s=500, tx=""))
    p.clock.advance(10_000)
    out = p.stage.process([])
    assert out.graph.changes == [] and p.pending() == 1
    assert p.metric("trace_repro_watermark_seconds", stage="entities") == 0


def test_unmatched_change_is_written_uncorrelated_once_upstream_passes_commit_plus_delay() -> None:
    """A change nobody's access explains is written uncorrelated (counted) once its writers would all be known."""
    p = Pipe()
    p.send(change(commit_s=1.0))  # offset 0
    out = p.upstream(3.0)
    assert out.graph.changes == [] and p.committable() == 0
    out = p.upstream(3.01)
    [row] = out.graph.changes
    assert (row["entity"], row["span"], row["strength"], row["skew_ms"]) == ("orders:8812", None, "none", None)
    assert (TP, 0) in out.release
    assert p.metric("trace_repro_row_changes_correlated_total", strength="none") == 1


def test_two_writers_of_the_same_value_are_credited_in_commit_order() -> None:
    """A lost update where both transactions wrote the same value: each commit goes to its own writer (commit order
    follows statement order on one row), not both to the first whose access arrived."""
    p = Pipe()
    first = access(end_s=1.000, tx="")
    second = replace(access(end_s=1.007, tx=""), trace_id="cd" * 16)  # it waited for the first one's row lock
    one = replace(change(commit_s=1.005, tx="901"), lsn=10)
    two = replace(change(commit_s=1.008, tx="902"), lsn=11)
    p.send(first, one)  # the first commit arrives when only the first writer is known ...
    p.send(second, two)
    out = p.upstream(10)
    credit = {r["lsn"]: (r["span"], r["strength"]) for r in out.graph.changes}
    assert credit == {10: (first.span_id, "commit_order"), 11: (second.span_id, "commit_order")}


def test_ambiguous_writers_stay_uncorrelated() -> None:
    """Two writers of the same value and only one change: nothing decides between them, so it is not guessed."""
    p = Pipe()
    p.send(access(end_s=1.000, tx=""), replace(access(end_s=1.002, tx=""), trace_id="cd" * 16))
    p.send(change(commit_s=1.003, tx="901"))
    out = p.upstream(10)
    assert [r["strength"] for r in out.graph.changes] == ["none"]
    assert p.stage.correlator.counters["ambiguous_values_time"] == 1


def test_pins_hold_the_oldest_pending_change() -> None:
    """The committable offset stays at the oldest pending change while later records pass."""
    p = Pipe()
    p.send(change(1, commit_s=1.0, tx="1"))  # offset 0
    p.send(access("orders:2", end_s=1.0, tx="2"))  # offset 1
    p.send(change(2, commit_s=5.0, tx="2b"))  # offset 2
    out = p.upstream(4)  # offset 3: credits offset 0 only
    assert [r["entity"] for r in out.graph.changes] == ["orders:1"]
    assert (TP, 0) in out.release
    p.stage.release(out.release)
    assert p.committable() == 2  # offset 2 still waits
    out = p.upstream(8)
    p.stage.release(out.release)
    assert p.pending() == 0
    p.drain()
    assert p.committable() == 6


def test_pending_changes_are_bounded() -> None:
    """Past max_pending_changes the oldest pending change is written uncorrelated and released."""
    p = Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES="2")
    out = p.send(change(1, tx="1"), change(1, tx="1b"), change(2, tx="2"))  # the first change is evicted
    assert [(r["entity"], r["tx"]) for r in out.graph.changes] == [("orders:1", "1")]
    assert (TP, 0) in out.release
    assert {(TP, 1), (TP, 2)}.isdisjoint(out.release)
    assert p.pending() == 2
    out = p.send(change(3, tx="3"))  # offset 3 evicts the next oldest
    assert [(r["entity"], r["tx"]) for r in out.graph.changes] == [("orders:1", "1b")]
    assert p.pending() == 2
    assert p.metric("trace_repro_dropped_total", component="correlation", reason="max_pending_changes") == 2


def test_pending_bound_eviction_writes_and_releases_oldest_entity() -> None:
    """The evicted change is written uncorrelated in the same batch and its offset released."""
    p = Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES="2")
    p.send(change(1, tx="1"), change(2, tx="2"))  # offsets 0, 1: both pending
    out = p.send(change(3, tx="3"))  # offset 2: evicts entity orders:1
    assert [(r["entity"], r["strength"]) for r in out.graph.changes] == [("orders:1", "none")]
    assert (TP, 0) in out.release
    assert (TP, 1) not in out.release
    assert p.metric("trace_repro_dropped_total", component="correlation", reason="max_pending_changes") == 1
    assert p.metric("trace_repro_row_changes_correlated_total", strength="none") == 1
    p.stage.release(out.release)
    assert p.committable() <= 1  # orders:2 still waits
    assert p.pending() == 2


def test_malformed_internal_message_is_dead_lettered() -> None:
    """A record that is not a valid internal event (including JSON that is not an object) goes to the DLQ."""
    p = Pipe()
    bad = [b"", b"{oops", b"[1]", b"null", b'{"v": 1, "kind": "access", "access": [1]}', b'{"v": 9}']
    good = change()
    records = [p.record("orders:x", v) for v in bad]
    records.append(p.record(good.entity_key, wire.encode_row_change(good)))
    out = p.stage.process(records)
    assert [o.value for o in out.produce] == bad
    assert {dict(o.headers)["reason"] for o in out.produce} == {b"internal_invalid"}
    assert [dict(o.headers)["source.offset"] for o in out.produce] == [str(i).encode() for i in range(len(bad))]
    assert p.metric("trace_repro_dlq_messages_total", reason="internal_invalid") == len(bad)
    assert p.committable() == len(bad)  # the good change is pending at the next offset


def test_forget_drops_pending_changes_of_a_revoked_partition() -> None:
    """A revoked partition's pending changes and pins are dropped; other partitions keep theirs."""
    p = Pipe()
    p.send(change(1, tx="1"), partition=0)
    p.send(change(2, tx="2"), partition=1)
    p.stage.forget(TP)
    assert p.committable(0) == 1
    assert p.committable(1) == 0
    p.send(access("orders:2", end_s=0.999, tx="2"), partition=1)
    out = p.upstream(10, partition=1)
    assert [r["entity"] for r in out.graph.changes] == ["orders:2"]  # the forgotten change is not written here
    assert ((TOPIC, 1), 0) in out.release


events_strategy = st.lists(
    st.tuples(
        st.booleans(),  # access (True) or row change
        st.integers(min_value=1, max_value=3),  # entity orders:<n>
        st.integers(min_value=0, max_value=3),  # tx id
        st.integers(min_value=0, max_value=80),  # event time, 0.1 s steps
        st.integers(min_value=0, max_value=1),  # partition
    ),
    max_size=25,
)
Event = tuple[bool, int, int, int, int]


def _feed(p: Pipe, events: list[Event], rnd: random.Random, max_pending: int) -> None:
    """Process the events in random batches, releasing after each; pending changes must hold their offsets."""
    queue = list(events)
    while queue:
        size = rnd.randint(1, 4)
        batch, queue = queue[:size], queue[size:]
        records = []
        for is_access, n, tx, tenth_s, partition in batch:
            if is_access:
                a = access(f"orders:{n}", end_s=tenth_s / 10, tx=str(tx))
                records.append(p.record(a.entity, wire.encode_access(a), partition))
            else:
                c = change(n, commit_s=tenth_s / 10, tx=str(tx))
                records.append(p.record(c.entity_key, wire.encode_row_change(c), partition))
        value = wire.encode_watermark(wire.Watermark(T0 + rnd.randint(0, 100) * S // 10, ("otlp_spans/0",)))
        records.append(p.record("", value, rnd.randint(0, 1)))  # upstream moves on now and then
        out = p.stage.process(records)
        p.stage.release(out.release)
        assert p.pending() <= max_pending
        for _, topic, partition, offset in p.stage._pending:  # a pending change's key is its record's position
            tp = (topic, partition)
            assert p.stage.committable(tp, p.positions[tp]) <= offset


@settings(max_examples=60, deadline=None)
@given(events_strategy, st.integers(min_value=1, max_value=4), st.randoms(use_true_random=False))
def test_pending_changes_hold_their_offsets(events: list[Event], max_pending: int, rnd: random.Random) -> None:
    """Whatever arrives in whatever batches, a pending change keeps its offset uncommittable and the bound holds."""
    _feed(Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES=str(max_pending)), events, rnd, max_pending)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(events_strategy, st.integers(min_value=1, max_value=4), st.randoms(use_true_random=False))
def test_every_offset_is_released_once_all_is_settled(
    events: list[Event], max_pending: int, rnd: random.Random
) -> None:
    """Once the idle watermark has settled everything, every position is committable with no pin left."""
    p = Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES=str(max_pending))
    _feed(p, events, rnd, max_pending)
    p.drain(0)
    p.drain(1)
    assert p.pending() == 0
    for tp, position in p.positions.items():
        assert p.stage.committable(tp, position) == position
        assert p.stage.tracker.pins.pinned(tp) == 0


def test_commit_for_an_already_judged_entity_is_released() -> None:
    """A change credited to an access whose row was judged already is released once settled."""
    p = Pipe()
    p.send(access("orders:2", end_s=0.0, tx="2"))  # offset 0
    out = p.upstream(3.5)  # offset 1: orders:2 is judged (its deadline T0 + 3 s has passed)
    p.stage.release(out.release)
    out = p.send(change(2, commit_s=0.0, tx="2"))  # offset 2: upstream is past its commit + delay already
    assert out.graph.changes == []  # late: due the credit delay after it came
    out = p.upstream(3.5 + CREDIT_S)  # offset 3
    assert [r["strength"] for r in out.graph.changes] == ["tx_id"]
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 5


def test_pinned_offsets_gauge_follows_the_pins() -> None:
    """trace_repro_pinned_offsets shows the input still held by open state, and drops to 0 once all settled."""
    p = Pipe()
    p.send(change(commit_s=1.0))
    p.upstream(2.0)
    assert p.metric("trace_repro_pinned_offsets", stage="entities") == 1
    p.drain()
    assert p.metric("trace_repro_pinned_offsets", stage="entities") == 0


def test_a_relay_emitted_in_stage_2_is_counted_not_lost_silently() -> None:
    """Relays go from stage 1 to stage 2; a stage-2 processor that emits one (a component built for the wrong stage)
    has it counted as dropped and logged, and the stage goes on."""

    class Stray(Processor):
        name = "stray"

        def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
            out.relays.append(Relay("stray", "k", watermark_ns, {}))

    p = Pipe()
    p.stage.processors.append(Stray())
    p.upstream(1)
    p.upstream(2)
    assert p.metric("trace_repro_dropped_total", component="entities", reason="relay_from_stage_2") == 2


def test_rows_of_a_revoked_partition_are_not_judged_here() -> None:
    """Each access reaches the processors with its internal partition, so that the collision detector drops the
    rows of a revoked partition: only the rows this instance still owns are judged (a lost update on each
    partition; partition 0 is revoked before event time passes them)."""
    p = Pipe()
    for key, partition in ((1, 0), (2, 1)):
        steps = [("aa", DbOperation.READ, 0.1), ("bb", DbOperation.READ, 0.2), ("aa", DbOperation.WRITE, 0.3),
                 ("bb", DbOperation.WRITE, 0.4)]  # fmt: skip
        p.send(*[replace(access(f"orders:{key}", end_s=at, op=op), trace_id=trace * 16) for trace, op, at in steps],
               partition=partition)  # fmt: skip
    p.stage.forget(TP)
    out = p.drain(partition=1)
    incidents = [e for e in out.events if getattr(e, "kind", "") == "incident"]
    assert [e.entity for e in incidents] == ["orders:2"]


def test_a_packed_record_is_dead_lettered_once_for_its_accesses_in_the_future_and_the_others_kept() -> None:
    """Stage 1 packs a batch's accesses into one record: two of them end beyond the wall clock (a foreign or corrupt
    writer). Both are dropped and counted, the record goes to the dead-letter topic once (not once per access), and
    the access beside them is kept."""
    p = Pipe()
    good, ahead = access("orders:1"), [access(f"orders:{n}", end_s=3600 * 24) for n in (2, 3)]
    out = p.stage.process([p.record("", wire.encode_accesses([ahead[0], good, ahead[1]]))])
    dead = [m for m in out.produce if m.topic == p.settings.kafka.dlq_topic]
    assert [dict(m.headers or ())["reason"] for m in dead] == [b"clock_skew"]
    assert p.metrics.telemetry("clock").dropped["future_time"] == 2
    assert p.metric("trace_repro_dlq_messages_total", reason="clock_skew") == 1
    assert "orders:1" in p.stage.correlator._history and "orders:2" not in p.stage.correlator._history


def test_a_packed_record_whose_accesses_fail_to_correlate_is_dead_lettered_once_and_each_failure_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = Pipe()
    real = p.stage.correlator.add_access

    def add_access(a: Access) -> None:
        if a.entity != "orders:1":
            raise RuntimeError("injected")
        real(a)

    monkeypatch.setattr(p.stage.correlator, "add_access", add_access)
    batch = [access(f"orders:{n}") for n in (2, 1, 3)]
    out = p.stage.process([p.record("", wire.encode_accesses(batch))])
    dead = [dict(m.headers or ())["reason"] for m in out.produce if m.topic == p.settings.kafka.dlq_topic]
    assert dead == [b"internal_error:RuntimeError"]
    assert p.metrics.telemetry("correlation").dropped["internal_error:RuntimeError"] == 2
    assert "orders:1" in p.stage.correlator._history
