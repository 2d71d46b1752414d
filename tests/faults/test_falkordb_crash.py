"""FalkorDB killed with SIGKILL while the daemon writes, then restarted from its append-only file.

The daemon works through a backlog on a private FalkorDB started with ``appendonly yes`` (``streamer.engines``);
a quarter of the way in, FalkorDB is killed (SIGKILL: no RDB saved on the way out), new traffic arrives while it
is down (the daemon consumes, fails to write and retries with backoff), and FalkorDB is started again on the same
port and data. Afterwards every trace and span is in the graph exactly once (what was written before the kill
survived, what failed was retried, nothing twice), every planted lost update is one incident occurrence on the
incidents topic and on the graph, and GitLab has one issue per fingerprint counting each occurrence once.
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

REQUESTS = 240  # per phase, 20 ms apart in event time
COLLISIONS = 5  # planted lost updates per phase
STEP_MS = 20.0


async def test_falkordb_sigkill_mid_stream_loses_and_doubles_nothing(healthy: LocalEngines) -> None:
    """FalkorDB SIGKILLed a quarter into a backlog, traffic while it is down, restarted: every trace, span and
    planted collision once, one issue per fingerprint."""
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
            at_kill = graph_counts(h)[0]
            healthy.kill("falkordb")
            assert at_kill < first_traces, "FalkorDB was killed too late to prove anything"
            try:
                await produce(kafka, traffic.stream(REQUESTS, COLLISIONS, step_ms=STEP_MS))
                await h.wait_for(lambda: h.metric_total("trace_repro_graph_write_retries_total") > 0,
                                 "graph writes retried while FalkorDB is down", 30)  # fmt: skip
            finally:
                await asyncio.to_thread(healthy.restart, "falkordb")
            assert graph_counts(h)[0] > 0, "the graph written before the kill did not survive the restart"

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
