"""Publishing claims each event's id on the real FalkorDB (``schema.PUBLISHED_CLAIM``): two instances deriving the
same events at once publish each exactly once, a claim its instance left unrecorded is taken over after the lease,
an event recorded before (or before claims existed) is not published again, and a wait ends when the daemon stops."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable

import pytest
from falkordb import FalkorDB

from processors.model.base import Published
from sinks.graph.sink import GraphSink
from sinks.graph.writer import GraphWriter, WriteAborted
from tests.gitlab.helpers import incident, occurrence

pytestmark = pytest.mark.engines

Make = Callable[..., GraphSink]


@pytest.fixture
async def instances(falkordb_url: str) -> AsyncIterator[Make]:
    """Graph sinks of separate instances (each its own owner and connection) on one fresh graph."""
    name = f"claims_{uuid.uuid4().hex[:8]}"
    made: list[GraphSink] = []

    def make(lease_s: float = 30.0, stopping: asyncio.Event | None = None) -> GraphSink:
        sink = GraphSink(GraphWriter(falkordb_url, name, stopping=stopping), clock_ms=lambda: 1.0, lease_s=lease_s)
        made.append(sink)
        return sink

    await make().start()
    try:
        yield make
    finally:
        for sink in made:
            await sink.close()
        host, port = falkordb_url.removeprefix("redis://").rsplit(":", 1)
        FalkorDB(host=host, port=int(port)).select_graph(name).delete()


def events(first: int, last: int) -> list[Published]:
    base = incident()
    return [occurrence(base, n) for n in range(first, last)]


async def publish(sink: GraphSink, batch: list[Published], published: list[str]) -> None:
    """What a stage runner does with a batch's events: claim, publish (here: note), record."""
    mine = await sink.claim(batch)
    for e in mine:
        published.append(e.event_id)
        await asyncio.sleep(0)  # the other instance runs between the publish and the record
    await asyncio.sleep(0.01)
    await sink.record(mine)


async def test_two_instances_deriving_the_same_events_publish_each_once(instances: Make) -> None:
    a, b = instances(), instances()
    published: list[str] = []
    for round_ in range(5):  # overlapping batches, both at once: the race of a rebalance
        first = round_ * 100
        await asyncio.gather(publish(a, events(first, first + 60), published),
                             publish(b, events(first + 20, first + 100), published))  # fmt: skip
    counts = Counter(published)
    assert len(counts) == 500
    assert max(counts.values()) == 1, [i for i, n in counts.items() if n > 1][:5]
    assert a.telemetry.events.get("claims_waited", 0) + b.telemetry.events.get("claims_waited", 0) > 0  # they met
    # and a replay of all of them, by either, publishes nothing
    assert await a.claim(events(0, 500)) == [] and await b.claim(events(250, 300)) == []


async def test_a_claim_left_unrecorded_is_taken_over_after_the_lease(instances: Make) -> None:
    stopped, successor = instances(), instances(lease_s=1.0)
    batch = events(0, 3)
    assert [e.event_id for e in await stopped.claim(batch)] == [e.event_id for e in batch]  # then it stops
    started = time.monotonic()
    taken = await successor.claim(batch)
    assert [e.event_id for e in taken] == [e.event_id for e in batch]
    assert time.monotonic() - started >= 0.7  # it waited for the lease (on the graph's clock), not much less
    assert successor.telemetry.events["claims_taken_over"] == 3
    with pytest.raises(TimeoutError):  # the old owner, were it back, no longer holds them: it waits
        await asyncio.wait_for(stopped.claim(batch), 0.3)
    await successor.record(taken)
    assert await stopped.claim(batch) == []


async def test_claims_are_kept_while_their_instance_is_still_publishing(instances: Make) -> None:
    slow, other = instances(lease_s=1.0), instances(lease_s=1.0)
    batch = events(0, 2)
    mine = await slow.claim(batch)
    async with slow.holding(mine):  # its publish waits on a broker for over two leases
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(other.claim(batch), 2.5)
        await slow.record(mine)
    assert await other.claim(batch) == []
    assert other.telemetry.events.get("claims_taken_over", 0) == 0 and slow.telemetry.events["claims_renewed"] >= 4


async def test_an_instance_publishes_again_what_it_claimed_and_did_not_record(instances: Make) -> None:
    sink = instances()
    batch = events(0, 4)
    await sink.claim(batch)  # its publish failed: the batch is tried again
    again = await sink.claim([*batch, batch[0]])
    assert [e.event_id for e in again] == [e.event_id for e in batch]  # each once, in order
    await sink.record(again)
    assert await sink.claim(batch) == []
    assert sink.telemetry.events["replayed_events"] == 1 + 4


async def test_events_recorded_before_claims_existed_are_not_published_again(instances: Make) -> None:
    sink = instances()
    batch = events(0, 2)
    await sink.query("UNWIND $ids AS id CREATE (:Published {id: id, kind: 'incident', at: 1.0})",
                     {"ids": [e.event_id for e in batch]})  # fmt: skip
    assert await sink.claim(batch) == []
    assert await sink.unseen(batch) == []


async def test_waiting_on_another_instances_claim_ends_when_the_daemon_stops(instances: Make) -> None:
    stopping = asyncio.Event()
    holder, waiter = instances(), instances(stopping=stopping)
    batch = events(0, 1)
    await holder.claim(batch)
    waiting = asyncio.create_task(waiter.claim(batch))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # held by a live instance within its lease
    stopping.set()
    with pytest.raises(WriteAborted):
        await asyncio.wait_for(waiting, 5)
