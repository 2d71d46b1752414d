"""The proof judge counts each collision once, across a crash: the counts of an incidents partition (every
collision arrives after its slice settled, straight into the contribution) keep their event time, so the graph's
retention keeps them, and a restarted judge that reads the same collision again does not count it twice.

The demo showed both: after its SIGKILL the judge's before-count was off (4 of 6 collisions; 8 lock waits from 6
requests), because the retention had deleted a contribution dated at the epoch and replayed events counted again.
"""

from __future__ import annotations

import time
import uuid

import pytest

from processors.connectors.proofs.contracts import collision_signature
from processors.connectors.proofs.desk import contribution_of, contribution_row
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.tallies import COUNTED_IDS, Contribution, PartKey
from sinks.graph import GraphSink, GraphWriter, schema
from tests.regressions.builders import MS, T0, S
from tests.regressions.test_proof_judge import _capture, _collision

INCIDENTS = "trace-repro.incidents/0"
KEY = ("shop", "1.0", INCIDENTS)


def _judge_with_traffic() -> ProofJudge:
    """Ten 1.0 requests, their slices settled: a collision reported now is late for its slice."""
    judge = ProofJudge(settle_ns=0)
    for j in range(10):
        judge.on_trace(_capture(T0 + j * 100 * MS, "1.0"))
    judge.close_until(T0 + 10 * S)
    return judge


def _stored(judge: ProofJudge) -> list[tuple[PartKey, Contribution]]:
    """The judge's changed contributions as the desk writes them and reads them back (the graph row's fields)."""
    return [(key, contribution_of(contribution_row(key, c, time.time() * 1000))) for key, c in judge.contributions()]


def test_a_late_collision_dates_its_contribution_and_counts_once() -> None:
    judge = _judge_with_traffic()
    collision = _collision(T0 + S, "1.0", "1.0")
    judge.on_incident(collision, INCIDENTS)
    judge.on_incident(collision, INCIDENTS)  # the same event read twice (a detector that published it again)
    stored = dict(_stored(judge))
    c = stored[KEY]
    assert c.tally.collisions == {collision_signature(collision): 1}
    assert c.first_ns <= T0 + S <= c.last_ns  # in event time: the retention's horizon reads it
    assert judge.counters["occurrence_repeated"] == 1


def test_a_restarted_judge_does_not_count_a_replayed_collision_again() -> None:
    before = _judge_with_traffic()
    first, second = _collision(T0 + S, "1.0", "1.0"), _collision(T0 + 2 * S, "1.0", "1.0")
    before.on_incident(first, INCIDENTS)
    stored = _stored(before)

    after = ProofJudge(settle_ns=0)  # a restart: nothing in memory but what the graph holds
    after.load(stored)
    after.on_incident(first, INCIDENTS)  # replayed: its offset was not committed before the crash
    after.on_incident(second, INCIDENTS)  # new
    after.close_until(T0 + 10 * S)  # (a restarted judge's horizon starts at 0: both went to open slices)
    c = dict(_stored(after))[KEY]
    assert c.tally.collisions == {collision_signature(first): 2}
    assert after.counters["occurrence_replayed"] == 1


def test_the_remembered_ids_are_bounded() -> None:
    judge = _judge_with_traffic()
    for j in range(COUNTED_IDS + 5):
        judge.on_incident(_collision(T0 + S + j * MS, "1.0", "1.0"), INCIDENTS)
    c = dict(_stored(judge))[KEY]
    assert len(c.tally.counted) == COUNTED_IDS
    assert sum(c.tally.collisions.values()) == COUNTED_IDS + 5


@pytest.mark.engines
async def test_the_graph_retention_keeps_a_late_counted_contribution(falkordb_url: str) -> None:
    """Retention at the traffic's own event time keeps the incidents partition's counts; a restarted judge loads
    them (before, its contribution was dated 0 and went with the first retention pass)."""
    graph = GraphSink(GraphWriter(falkordb_url, f"judges_{uuid.uuid4().hex[:8]}"), clock_ms=lambda: time.time() * 1e3)
    await graph.start()
    try:
        judge = _judge_with_traffic()
        judge.on_incident(_collision(T0 + S, "1.0", "1.0"), INCIDENTS)
        rows = [contribution_row(key, c, time.time() * 1000) for key, c in judge.contributions()]
        await graph.writer.write_rows("tallies", schema.UPSERTS["tallies"], rows)
        await graph.expire_spans((T0 + 10 * S) / 1e6)  # a retention pass at the traffic's event time
        stored = await graph.tallies_since(0)
        restarted = ProofJudge(settle_ns=0)
        restarted.load([((r["service"], r["version"], r["part"]), contribution_of(r)) for r in stored])
        by_key = {(r["service"], r["version"], r["part"]): r for r in stored}
        assert KEY in by_key, f"the incidents partition's counts were expired: {sorted(by_key)}"
        assert sum(contribution_of(by_key[KEY]).tally.collisions.values()) == 1
    finally:
        await graph.writer._graph.delete()
        await graph.close()
