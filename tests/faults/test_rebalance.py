"""Two replicas of the daemon in one consumer group, then one of them stopped mid-stream: its partitions move.

Both replicas run both stages and the GitLab sink, with the same settings (group ids, topics, graph): each stage
is one consumer group of two members. The spans and Debezium topics have two partitions (spans keyed by trace
id, as ``partition_traces_by_id`` does; row changes keyed by primary key), the internal topic two
(``kafka.accesses_partitions``), so each replica owns part of every stage. Traffic flows at a steady pace for
twelve seconds. Replica A starts alone; replica B joins after two seconds of traffic (a rebalance: A gives up half
of its partitions, with traces half-assembled and rows half-judged); two seconds later A is stopped (gracefully:
it settles, commits what is safe and leaves: a second rebalance, B owns everything and replays what A had not
finished) while the traffic goes on. Afterwards every trace is in the graph exactly once and whole (its root
route, not a fragment), every span once, every planted lost update is one incident occurrence, every row change
B credited (replays included) went to its writer, and GitLab has one issue per fingerprint counting each occurrence
once.
"""

from __future__ import annotations

import asyncio

import pytest

from bench.gitlab_server import FakeGitLab
from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    GITLAB_PROJECT,
    GITLAB_TOKEN,
    ROOT_LAG,
    Traffic,
    assert_graph_exactly_once,
    assert_graph_occurrences_once,
    assert_incidents_once,
    assert_one_issue_per_fingerprint,
    cdc_topic,
    fault_harness,
    graph_counts,
    incident_events,
    live,
    wait_all,
    wait_committed_past,
    wait_issues,
)
from tests.harness import Harness

pytestmark = pytest.mark.engines

PARTITIONS = 2
SECONDS = 12.0  # of live traffic: A alone, then A and B, then B alone
PER_S = 40  # requests per second
COLLISION_EVERY_S = 1.0


async def test_replica_stopped_mid_stream_hands_over_without_loss_or_duplicates(healthy: LocalEngines) -> None:
    """A second replica joins and the first leaves while traffic flows: every trace (whole), span and planted
    collision once, one issue per fingerprint."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        a = fault_harness(kafka, falkordb, gitlab, kafka__max_poll_records="4",
                          kafka__accesses_partitions=str(PARTITIONS))  # fmt: skip
        b = Harness(a.settings, kafka, falkordb)
        k = a.settings.kafka
        traffic = Traffic(k.spans_topic, cdc_topic(a), root_lag=ROOT_LAG)
        expected = traffic.expected
        flowing: asyncio.Task[None] | None = None
        try:
            await a.create_topics(k.spans_topic, cdc_topic(a), k.accesses_topic, partitions=PARTITIONS)
            await a.start()
            flowing = asyncio.create_task(live(kafka, traffic, seconds=SECONDS, per_s=PER_S,
                                               collision_every_s=COLLISION_EVERY_S))  # fmt: skip
            await a.wait_for(lambda: graph_counts(a)[0] >= PER_S * 2, "two seconds of traffic on replica A", 30)
            await b.start()  # the first rebalance: A keeps half of every stage's partitions
            assert not flowing.done(), "replica B joined after the traffic"
            joined = graph_counts(a)[0]
            await a.wait_for(lambda: graph_counts(a)[0] >= joined + PER_S * 2, "two seconds on both replicas", 30)
            assert b.daemon is not None and all(r.consumer is not None and r.consumer.assignment()
                                                for r in b.daemon.runners), "replica B owns nothing"  # fmt: skip
            await a.stop()  # the second rebalance: B owns everything and replays what A had not finished
            assert not flowing.done(), "replica A left after the traffic"
            await flowing

            planted = len(expected.planted)
            await wait_all(b, expected, "every trace and incident on replica B", 60)
            assert b.daemon is not None  # every row carries its writer's trace id: each change is credited to it,
            uncorrelated = b.daemon.metrics.registry.get_sample_value(  # replayed ones included
                "trace_repro_row_changes_correlated_total", {"strength": "none"})  # fmt: skip
            assert not uncorrelated, f"{uncorrelated} row changes credited to no writer on replica B"
            for runner in b.daemon.runners:  # B really took A's partitions over
                assert runner.consumer is not None
                owned = {(tp.topic, tp.partition) for tp in runner.consumer.assignment()}
                topic = k.spans_topic if runner.name == "ingest" else k.accesses_topic
                assert {(topic, p) for p in range(PARTITIONS)} <= owned, (runner.name, sorted(owned))
            await wait_committed_past(b, "every stage committed past its input")
            events = incident_events(await b.consume_all(k.incidents_topic, expect=planted + 1, timeout_s=4))
            await wait_issues(b, gitlab, events)
            await asyncio.sleep(1.0)  # anything filed or written twice would show up now

            assert_graph_exactly_once(b, expected)
            assert_incidents_once(events, expected)
            assert_graph_occurrences_once(b, events)
            assert_one_issue_per_fingerprint(gitlab, events)
        finally:
            if flowing is not None and not flowing.done():
                flowing.cancel()
            await b.stop()
            await a.stop()
