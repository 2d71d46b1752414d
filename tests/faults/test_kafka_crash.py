"""The Kafka broker killed with SIGKILL while the daemon consumes, then restarted: nothing lost, nothing twice.

The daemon (both stages and the GitLab sink, in process) works through a backlog on a private single-node Kafka;
a quarter of the way in, the broker is killed (SIGKILL: no controlled shutdown, the log recovered on restart) and
started again on the same port and data; then new traffic follows. Afterwards every trace and span is in the graph
exactly once, every planted lost update is one incident occurrence on the incidents topic and on the graph, and
GitLab has one issue per fingerprint counting each occurrence once.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.gitlab_server import FakeGitLab
from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    GITLAB_PROJECT,
    GITLAB_TOKEN,
    MS,
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
    produce,
    wait_all,
    wait_committed_past,
    wait_issues,
)

pytestmark = pytest.mark.engines

REQUESTS = 240  # per phase, 20 ms apart in event time: traces close one by one as the daemon reads on
COLLISIONS = 5  # planted lost updates per phase
STEP_MS = 20.0


async def test_kafka_sigkill_mid_stream_loses_and_doubles_nothing(healthy: LocalEngines) -> None:
    """Kafka SIGKILLed a quarter into a backlog and restarted: every trace, span and planted collision once, one
    issue per fingerprint."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        h = fault_harness(kafka, falkordb, gitlab, kafka__max_poll_records="4")
        k = h.settings.kafka
        traffic = Traffic(k.spans_topic, cdc_topic(h), root_lag=ROOT_LAG)
        expected = traffic.expected
        try:
            await h.create_topics(k.spans_topic, cdc_topic(h))
            backlog = traffic.stream(REQUESTS, COLLISIONS, start_ns=time.time_ns() - int(REQUESTS * STEP_MS * MS),
                                     step_ms=STEP_MS)  # fmt: skip
            await produce(kafka, backlog)
            first_traces = len(expected.traces)
            await h.start()
            await h.wait_for(lambda: graph_counts(h)[0] >= first_traces // 4, "a quarter of the backlog", 60)
            healthy.kill("kafka")
            at_kill = graph_counts(h)[0]
            assert at_kill < first_traces, "the broker was killed too late to prove anything"
            await asyncio.sleep(1.0)  # the daemon runs into the dead broker: fetches, produces and commits fail
            await asyncio.to_thread(healthy.restart, "kafka")

            await produce(kafka, traffic.stream(REQUESTS, COLLISIONS, step_ms=STEP_MS))
            planted = len(expected.planted)
            await wait_all(h, expected, "every trace and incident after the restart", 60)
            await wait_committed_past(h, "every stage committed past its input")
            events = incident_events(await h.consume_all(k.incidents_topic, expect=planted + 1, timeout_s=4))
            await wait_issues(h, gitlab, events)
            await asyncio.sleep(1.0)  # anything filed or written twice would show up now

            assert_graph_exactly_once(h, expected)
            assert_incidents_once(events, expected)
            assert_graph_occurrences_once(h, events)
            assert_one_issue_per_fingerprint(gitlab, events)
        finally:
            await h.stop()
