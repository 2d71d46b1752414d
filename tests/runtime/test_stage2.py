"""EntityStage without engines: wire-encoded Access and RowChange records in, correlated change rows and pins out."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from streamer import config, wire
from streamer.events import Access, CdcOp, DbOperation, LockMode, RowChange
from streamer.runtime.metrics import Metrics
from streamer.runtime.records import Record, StageOutput
from streamer.runtime.stage2 import EntityStage
from tests.fake_clock import FakeClock

S = 1_000_000_000
MS = 1_000_000
T0 = 1_700_000_000 * S
TOPIC = "trace-repro.accesses"
TP = (TOPIC, 0)
# watermark = newest event - 0.5 s; a change waits until the watermark passes its commit + 2 s
ENV = {
    "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0.5",
    "TRACE_REPRO_WINDOWS__IDLE_S": "30",
    "TRACE_REPRO_CORRELATION__WAIT_S": "2",
}
_span_ids = itertools.count(1)


class Pipe:
    """An EntityStage fed Records at consecutive offsets, with a fake clock and its own metrics."""

    def __init__(self, **env: str) -> None:
        self.settings = config.load(None, env={**ENV, **env})
        assert self.settings.kafka.accesses_topic == TOPIC
        self.clock = FakeClock()
        self.metrics = Metrics()
        self.stage = EntityStage(self.settings, self.metrics, self.clock)
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

    def committable(self, partition: int = 0) -> int:
        tp = (TOPIC, partition)
        return self.stage.committable(tp, self.positions[tp])

    def pending(self) -> int:
        """How many row changes wait for their access."""
        return self.stage.pending_changes

    def drain(self) -> StageOutput:
        """No input for a long time: the idle watermark settles everything; release what the stage gives back."""
        self.clock.advance(10_000)
        out = self.stage.process([])
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


def test_change_waits_for_an_access_that_arrives_after_it() -> None:
    """A change with no access yet is pending and pinned; the access arriving later correlates it and releases
    its pending pin."""
    p = Pipe()
    out = p.send(change())  # offset 0
    assert out.graph.changes == []
    assert out.release == []
    assert p.committable() == 0
    assert p.pending() == 1
    a = access(end_s=0.999)
    out = p.send(a)  # offset 1
    [row] = out.graph.changes
    assert (row["entity"], row["span"], row["strength"], row["tx"]) == ("orders:8812", a.span_id, "tx_id", "771")
    assert (TP, 0) in out.release
    assert p.metric("trace_repro_row_changes_correlated_total", strength="tx_id") == 1
    assert p.pending() == 0
    assert p.committable() == 0  # still pinned until the runtime has written the row and releases
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 2


def test_change_after_its_access_correlates_at_once() -> None:
    """When the access is already known the change is written immediately and never waits."""
    p = Pipe()
    a = access(end_s=0.999)
    p.send(a)
    out = p.send(change())
    assert [(r["span"], r["strength"]) for r in out.graph.changes] == [(a.span_id, "tx_id")]
    assert p.pending() == 0
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 2


def test_unmatched_change_is_written_uncorrelated_once_watermark_passes_commit_plus_wait() -> None:
    """An unmatched change stays pending (pinned) until the watermark passes commit + wait_s, then is written
    uncorrelated and released."""
    p = Pipe()
    p.send(change(commit_s=1.0))  # offset 0
    out = p.send(access("orders:1", end_s=3.5, tx=""))  # watermark T0 + 3.0 s = commit + wait: not past it
    assert out.graph.changes == []
    assert p.committable() == 0
    out = p.send(access("orders:1", end_s=3.502, tx=""))  # watermark T0 + 3.002 s
    [row] = out.graph.changes
    assert (row["entity"], row["span"], row["strength"], row["skew_ms"]) == ("orders:8812", None, "none", None)
    assert (TP, 0) in out.release
    assert p.pending() == 0
    assert p.metric("trace_repro_row_changes_correlated_total", strength="none") == 1
    assert p.committable() == 0
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 3


def test_pending_change_expires_with_the_clock_when_input_stops() -> None:
    """With no more input, the idle watermark follows the fake clock and expires the pending change."""
    p = Pipe()
    p.send(change(commit_s=1.0))  # watermark T0 + 0.5 s
    p.clock.advance(30 + 2.5)  # idle: watermark T0 + 3.0 s, not past commit + wait
    assert p.stage.process([]).graph.changes == []
    p.clock.advance(0.01)  # watermark T0 + 3.01 s
    out = p.stage.process([])
    assert [r["strength"] for r in out.graph.changes] == ["none"]
    assert (TP, 0) in out.release
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 1


def test_pins_hold_the_oldest_pending_change() -> None:
    """The committable offset stays at the oldest pending change while later changes and accesses pass."""
    p = Pipe()
    p.send(change(1, commit_s=1.0, tx="1"))  # offset 0: pending
    a2 = access("orders:2", end_s=1.0, tx="2")
    p.send(a2)  # offset 1
    out = p.send(change(2, commit_s=1.001, tx="2"))  # offset 2: correlates at once
    assert [r["span"] for r in out.graph.changes] == [a2.span_id]
    p.stage.release(out.release)
    p.send(change(3, commit_s=1.2, tx="3"))  # offset 3: pending
    assert p.pending() == 2
    assert p.committable() == 0
    out = p.send(access("orders:1", end_s=0.999, tx="1"))  # offset 4: resolves offset 0
    assert (TP, 0) in out.release
    assert (TP, 3) not in out.release
    p.stage.release(out.release)
    assert p.pending() == 1
    assert p.committable() <= 3  # offset 3 still waits for its access
    out = p.send(access("orders:3", end_s=1.1, tx="3"))  # offset 5
    assert (TP, 3) in out.release
    p.stage.release(out.release)
    assert p.pending() == 0
    p.drain()
    assert p.committable() == 6


def test_pending_changes_are_bounded() -> None:
    """Past max_pending_changes the oldest entity's pending changes are written uncorrelated and released."""
    p = Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES="2")
    out = p.send(change(1, tx="1"), change(1, tx="1b"), change(2, tx="2"))  # entity 1 (2 changes) evicted
    assert [(r["entity"], r["tx"]) for r in out.graph.changes] == [("orders:1", "1"), ("orders:1", "1b")]
    assert {(TP, 0), (TP, 1)} <= set(out.release)
    assert (TP, 2) not in out.release
    assert p.pending() == 1
    out = p.send(change(3, tx="3"))  # offset 3
    assert out.graph.changes == []  # 2 pending is within the bound
    assert p.pending() == 2
    assert p.metric("trace_repro_dropped_total", component="correlation", reason="pending_bound") == 2


def test_pending_bound_eviction_writes_and_releases_oldest_entity() -> None:
    """The evicted changes are written uncorrelated in the same batch and their offsets released."""
    p = Pipe(TRACE_REPRO_CORRELATION__MAX_PENDING_CHANGES="2")
    p.send(change(1, tx="1"), change(2, tx="2"))  # offsets 0, 1: both pending
    out = p.send(change(3, tx="3"))  # offset 2: evicts entity orders:1
    assert [(r["entity"], r["strength"]) for r in out.graph.changes] == [("orders:1", "none")]
    assert (TP, 0) in out.release
    assert (TP, 1) not in out.release
    assert p.metric("trace_repro_dropped_total", component="correlation", reason="pending_bound") == 1
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
    out = p.send(access("orders:2", end_s=0.999, tx="2"), partition=1)
    assert out.release == [((TOPIC, 1), 0)]
    p.clock.advance(100)
    assert p.stage.process([]).graph.changes == []  # the forgotten change is not written by this owner


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
        out = p.stage.process(records)
        p.stage.release(out.release)
        assert p.pending() <= max_pending
        for pending in p.stage._pending.values():
            for _, (tp, offset) in pending:
                assert p.stage.committable(tp, p.positions[cast(tuple[str, int], tp)]) <= offset


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
    p.drain()
    assert p.pending() == 0
    for tp, position in p.positions.items():
        assert p.stage.committable(tp, position) == position
        assert p.stage.pins.pinned(tp) == 0


def test_commit_for_an_already_judged_entity_is_released() -> None:
    """A row change correlated with an access whose entity was already judged is released once settled."""
    p = Pipe()
    p.send(change(1, commit_s=3.5, tx="1"))  # offset 0: watermark T0 + 3.0 s
    out = p.send(access("orders:2", end_s=0.0, tx="2"))  # offset 1: orders:2 judged at once (deadline T0 + 3 s)
    p.stage.release(out.release)
    out = p.send(change(2, commit_s=0.0, tx="2"))  # offset 2: correlates with that access
    assert [r["strength"] for r in out.graph.changes] == ["tx_id"]
    p.stage.release(out.release)
    p.drain()
    assert p.committable() == 3


def test_pinned_offsets_gauge_follows_the_pins() -> None:
    """trace_repro_pinned_offsets shows the input still held by open state, and drops to 0 once all settled."""
    p = Pipe()
    p.send(change(commit_s=1.0))
    assert p.metric("trace_repro_pinned_offsets", stage="entities") == 1
    p.drain()
    assert p.metric("trace_repro_pinned_offsets", stage="entities") == 0
