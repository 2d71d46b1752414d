"""Event time across stage-1 workers (``run --workers N``), both stages in process on a fake clock.

Each worker is a consumer of the group with its share of the input partitions: the spans on one, the row changes
on another, a spans partition with no traffic on a third. Stage 2's event time is the minimum of what every
worker promised for the partitions it owns, so a worker that owns only row changes must hold it back (while it is
down, and while it replays what it had not committed), and a worker that owns only a silent partition must not.
"""

from __future__ import annotations

import random

from streamer.decode.registry import Record
from tests.runtime.chain import CDC, CHARGES_CDC, SPANS, T0, Chain, S, Scenario

SPAN_OWNER, CDC_OWNER = [(SPANS, 0)], [(CDC, 0), (CHARGES_CDC, 0)]


def _scenario(rounds: int) -> Scenario:
    s = Scenario()
    for i in range(rounds):
        s.lost_update(row=10 + i, at_ns=T0 + i * 6 * S + S)
        s.serial_update(row=100 + i, at_ns=T0 + i * 6 * S + 3 * S, value=f"v{i}")
        s.double_charge(order=700 + i, at_ns=T0 + i * 6 * S + 4 * S)
    return s


def _run(
    chain: Chain,
    scenario: Scenario,
    *,
    down: tuple[int, int] | None = None,
    unacked_s: float = 0,
    takeover: bool = False,
    spans_partitions: int = 1,
) -> None:
    """Feed the scenario in arrival order, a few records a batch, the clock following event time. While the clock is
    in ``down`` (ns), the second worker is dead: the records of its partitions wait on their topics, and when it
    comes back they are replayed from its last commit: what its pins held (the spans of traces still open), and
    what it sent in its last ``unacked_s`` seconds before it died (killed before it committed them). A new instance
    of it replays them (a supervisor's restart) or, with ``takeover``, the first worker, which the rebalance hands
    its partitions: it catches up on them a few records a batch, a second of wall time each, while its own
    partitions stay idle. Then everything goes idle."""
    rnd = random.Random(3)
    inputs = chain.arrivals(scenario, spans_partitions)
    dead_tps = set(chain.workers[1].assignment)
    waiting: list[Record] | None = None
    i = 0
    while i < len(inputs):
        size = rnd.randint(1, 4)
        batch = [r for _, r in inputs[i : i + size]]
        chain.clock.now = max(chain.clock.now, inputs[min(i + size, len(inputs)) - 1][0] + 100_000_000)
        i += size
        dead = down is not None and down[0] <= chain.clock.now < down[1]
        if dead:
            if waiting is None:  # killed: what it sent since its last commit waits for a replay
                waiting = _uncommitted(chain, [(t, r) for t, r in inputs[: i - size] if (r.topic, r.partition)
                                               in dead_tps], since_ns=down[0] - int(unacked_s * S))  # fmt: skip
            waiting += [r for r in batch if (r.topic, r.partition) in dead_tps]
            chain._step([r for r in batch if (r.topic, r.partition) not in dead_tps], [chain.workers[0]])
            continue
        if waiting is not None and takeover:
            chain.workers = [chain.workers[0]]
            chain.workers[0].assign(dead_tps | chain.workers[0].assignment)
            while waiting:
                chain.clock.advance(1)
                n = rnd.randint(1, 4)
                chain._step(waiting[:n])
                waiting = waiting[n:]
        elif waiting is not None:
            chain.workers[1] = chain.ingest_stage(sorted(dead_tps))
            batch = waiting + batch
        waiting = None
        chain._step(batch)
    for _ in range(150):
        chain.clock.advance(0.5)
        chain._step([])


def _uncommitted(chain: Chain, sent: list[tuple[int, Record]], since_ns: int) -> list[Record]:
    """What the dead worker must have replayed: from the offset its pins let it commit (the spans of its open
    traces), and everything it sent from ``since_ns`` on (sent, not committed)."""
    positions: dict[tuple[str, int], int] = {}
    for _, r in sent:
        positions[(r.topic, r.partition)] = r.offset + 1
    committed = {tp: chain.workers[1].committable(tp, position) for tp, position in positions.items()}
    return [r for t, r in sent if r.offset >= committed[(r.topic, r.partition)] or t >= since_ns]


def _found(chain: Chain) -> set[tuple[str, str, str]]:
    return {(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in chain.found.incidents}


def test_a_worker_owning_only_row_changes_holds_stage_2_while_it_is_down() -> None:
    """Spans on one worker, row changes on another that dies for 45 s of the run and is replaced: every planted
    lost update and double charge is found once and every change credited to its writer (judged before the
    waiting changes arrived, they would not be), and no input stays pinned."""
    scenario = _scenario(12)
    chain = Chain({}, owners=(SPAN_OWNER, CDC_OWNER))
    _run(chain, scenario, down=(T0 + 15 * S, T0 + 60 * S))
    assert _found(chain) == scenario.collisions
    assert len(chain.found.incidents) == len(scenario.collisions)
    assert {lsn: chain.found.functions[span] for lsn, span in chain.found.credits.items()} == scenario.credits
    assert chain.committable_everywhere()


def test_row_changes_sent_twice_by_a_worker_killed_before_its_commit_lose_no_defect() -> None:
    """The row-change worker is SIGKILLed after sending its last 3 s of row changes but before committing them:
    its replacement sends them again, and stage 2 may hold both copies of a change at once. Each defect is still
    found once (a phantom's two inserts are two changes for its two writers, not four) and credited to its
    writer."""
    scenario = _scenario(12)
    chain = Chain({}, owners=(SPAN_OWNER, CDC_OWNER))
    _run(chain, scenario, down=(T0 + 30 * S, T0 + 40 * S), unacked_s=3)
    assert _found(chain) == scenario.collisions
    assert len(chain.found.incidents) == len(scenario.collisions)
    assert {lsn: chain.found.functions[span] for lsn, span in chain.found.credits.items()} == scenario.credits


def test_a_worker_taking_over_a_dead_workers_partitions_holds_stage_2_until_it_has_replayed_them() -> None:
    """The worker owning a spans partition and the row changes is SIGKILLed; 30 s later the rebalance hands its
    partitions to the surviving worker, whose own spans partition has moved on meanwhile. Until it has replayed
    the dead worker's backlog, stage 2 stays at what the dead worker promised for them: the survivor's promise
    for its own partition does not vouch for the ones it just took over (had it, the replayed row changes would
    be judged before the replayed accesses of their writers), so every defect is found and credited."""
    scenario = _scenario(12)
    chain = Chain({}, owners=(SPAN_OWNER, [(SPANS, 1), *CDC_OWNER]))
    _run(chain, scenario, down=(T0 + 20 * S, T0 + 50 * S), unacked_s=3, takeover=True, spans_partitions=2)
    assert _found(chain) == scenario.collisions
    assert len(chain.found.incidents) == len(scenario.collisions)
    assert {lsn: chain.found.functions[span] for lsn, span in chain.found.credits.items()} == scenario.credits
    assert chain.committable_everywhere()


def test_the_row_change_worker_is_a_source_of_stage_2_event_time() -> None:
    """The worker owning only row changes publishes its progress for them: held at zero until its partition first
    delivers, then the commit time it reached; stage 2 takes it into its minimum."""
    scenario = _scenario(1)
    chain = Chain({}, owners=(SPAN_OWNER, CDC_OWNER))
    chain._step([])
    sources = [marks._sources for marks in chain.entities._upstream.values()]
    assert len(sources) == 2 and all(s[f"{CDC}/0"].watermark_ns == 0 for s in sources)
    commit_ns, key, value, topic = scenario.changes[0]
    chain.clock.now = commit_ns + 6 * S  # the charges partition, silent since assigned, is idle by now
    chain._step([chain._record(topic, 0, key, value)])
    reached = commit_ns // 1_000_000 * 1_000_000  # Debezium's commit time is in ms
    assert all(s[f"{CDC}/0"].watermark_ns == reached for s in sources)
    assert chain.entities.event_time() == reached  # the binding promise: the silent spans worker's is the clock


def test_a_worker_owning_only_a_silent_spans_partition_does_not_stall_stage_2() -> None:
    """A third worker owns a spans partition that never gets traffic: held while it may have a backlog, then, read
    to its end and silent, it promises the wall clock (nothing older can come), and stage 2 finds everything."""
    scenario = _scenario(4)
    never = {"TRACE_REPRO_WINDOWS__UPSTREAM_EXPIRY_S": "100000"}  # released by its owner's promise, not by expiry
    chain = Chain(never, owners=(SPAN_OWNER, CDC_OWNER, [(SPANS, 1)]))
    _run(chain, scenario)
    assert _found(chain) == scenario.collisions
    assert chain.entities.event_time() > max(t for t, _ in scenario.spans)
    for marks in chain.entities._upstream.values():  # its promise follows the clock
        assert marks._sources[f"{SPANS}/1"].watermark_ns > max(t for t, _ in scenario.spans)
