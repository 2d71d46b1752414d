"""A replica killed (SIGKILL) while partitions move, on the shipped configuration, under live traffic.

Two replicas of the daemon run both stages and the GitLab sink on ``config/trace-repro.toml`` as shipped, with the
same names: each stage (and each sink) is one consumer group of two members. Replica A is a ``trace-repro run``
process; replica B runs in this process. The spans and Debezium topics have two partitions (the internal one six,
as shipped). A starts alone and traffic flows; B joins, and the moment the broker reports stage 1's group
rebalancing, A is killed with SIGKILL: no revocation finished, nothing settled, its uncommitted input and its open
traces and rows lost with it. The group waits for A's session to expire, then B owns everything and replays what A
had not committed, while the traffic goes on. Afterwards every trace that touched a row is in the graph exactly once
(the shipped graph policy keeps only those), every planted lost update is one incident occurrence (on the incidents
topic, on the graph and on its GitLab issue), and GitLab has one issue per fingerprint counting each occurrence once.

Delivery to the incidents topic is at least once: a replica killed between an incident's acknowledgement and its
record on the graph makes the next owner publish it again, as the same occurrence (the GitLab sink and the graph
count it once). The test allows that, and says how often it happened.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from bench.gitlab_server import FakeGitLab
from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    GITLAB_PROJECT,
    GITLAB_TOKEN,
    ROOT_LAG,
    assert_graph_occurrences_once,
    assert_one_issue_per_fingerprint,
    cdc_topic,
    incident_events,
    live,
    wait_committed_past,
    wait_issues,
)
from tests.faults.shipped import (
    SHIPPED,
    PathsTraffic,
    assert_paths_exactly_once,
    counted,
    shipped_env,
    shipped_harness,
    wait_paths,
)

pytestmark = pytest.mark.engines

PARTITIONS = 2
SECONDS = 12.0  # of live traffic
PER_S = 40  # requests per second
COLLISION_EVERY_S = 1.0
REBALANCING = ("PreparingRebalance", "CompletingRebalance")


async def _group_state(bootstrap: str, group: str) -> tuple[str, int]:
    """(state, members) of a consumer group, as its coordinator reports them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [response] = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    description = response.groups[0]
    return str(description[2]), len(description[5])


def _replica(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``trace-repro run`` on the shipped file with ``env``, its output in ``log``."""
    cmd = [sys.executable, "-m", "streamer.cli", "run", "--config", str(SHIPPED)]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                cwd=SHIPPED.parents[1])  # fmt: skip


def assert_incidents_once_per_row(events: list[dict[str, Any]], planted: list[str]) -> int:
    """One ``lost_update`` occurrence per planted row (an occurrence published again, as the same occurrence, is
    allowed: at-least-once delivery); returns how many events were such re-publications."""
    by_row: dict[str, set[str]] = defaultdict(set)
    for e in events:
        assert e["anomaly"] == "lost_update", e["anomaly"]
        assert {e["culprit"]["function"], e["victim"]["function"]} == {"expire_cart", "capture_payment"}
        by_row[e["entity"]].add(e["occurrence"])
    doubled = {row: ids for row, ids in by_row.items() if len(ids) > 1}
    assert not doubled, f"rows reported as more than one occurrence: {doubled}"
    missed = set(planted) - by_row.keys()
    assert not missed, f"{len(missed)} of {len(planted)} planted lost updates not reported: {sorted(missed)}"
    assert by_row.keys() == set(planted), f"unexpected incidents: {sorted(by_row.keys() - set(planted))}"
    copies = Counter(e["occurrence"] for e in events)
    return sum(n - 1 for n in copies.values())


async def test_replica_killed_while_partitions_move_loses_and_doubles_nothing(
    healthy: LocalEngines, tmp_path: Path
) -> None:
    """SIGKILL of one replica in the middle of a rebalance: every trace touching a row, span and planted collision
    once, one issue per fingerprint."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    began = time.monotonic()
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        env = shipped_env(kafka, falkordb, gitlab)
        b = shipped_harness(env)
        k = b.settings.kafka
        traffic = PathsTraffic(k.spans_topic, cdc_topic(b), root_lag=ROOT_LAG)
        expected = traffic.expected
        await b.create_topics(k.spans_topic, cdc_topic(b), partitions=PARTITIONS)
        a = _replica(env, tmp_path / "replica-a.log")
        flowing: asyncio.Task[None] | None = None
        try:
            deadline = time.monotonic() + 60
            while await _group_state(kafka, k.group_id) != ("Stable", 1):  # A consumes
                assert a.poll() is None, (tmp_path / "replica-a.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "replica A never joined stage 1's group"
                await asyncio.sleep(0.2)
            flowing = asyncio.create_task(live(kafka, traffic, seconds=SECONDS, per_s=PER_S,
                                               collision_every_s=COLLISION_EVERY_S))  # fmt: skip
            await asyncio.sleep(3.0)  # (A alone for a while: it holds open traces and rows when B joins)
            assert b.daemon is None
            joining = asyncio.create_task(b.start())  # B joins: every group rebalances
            deadline = time.monotonic() + 30
            while (state := (await _group_state(kafka, k.group_id))[0]) not in REBALANCING:
                assert not joining.done() or joining.exception() is None, joining.exception()
                assert time.monotonic() < deadline, f"stage 1's group never rebalanced (state {state})"
                await asyncio.sleep(0.02)
            a.send_signal(signal.SIGKILL)  # while the partitions move
            a.wait(10)
            killed_in = state
            assert not flowing.done(), "replica A was killed after the traffic"
            await joining  # B owns everything once A's session has expired
            await flowing

            planted = len(expected.planted)
            await wait_paths(b, traffic, "every trace and incident on replica B", 120)
            assert b.daemon is not None
            for runner in b.daemon.runners:  # B really took everything over
                assert runner.consumer is not None
                owned = {(tp.topic, tp.partition) for tp in runner.consumer.assignment()}
                topic, n = (k.spans_topic, PARTITIONS) if runner.name == "ingest" else (k.accesses_topic, 6)
                assert {(topic, p) for p in range(n)} <= owned, (runner.name, sorted(owned))
            await wait_committed_past(b, "every stage committed past its input", 90)
            events = incident_events(await b.consume_all(k.incidents_topic, expect=planted + 1, timeout_s=4))
            await wait_issues(b, gitlab, events)
            await asyncio.sleep(1.0)  # anything filed or written twice would show up now

            assert_paths_exactly_once(b, traffic)
            republished = assert_incidents_once_per_row(events, expected.planted)
            assert_graph_occurrences_once(b, list({e["occurrence"]: e for e in events}.values()))
            assert_one_issue_per_fingerprint(gitlab, events)
            print(f"\nreplica A killed while stage 1's group was {killed_in}; {len(expected.traces)} requests, "
                  f"{len(traffic.touching)} traces touching a row in the graph once, {planted} planted lost updates -> "
                  f"{len(events) - republished} occurrences ({republished} published again), {len(gitlab.issues())} "
                  f"issue(s); replica B counted {counted(b)}; test {time.monotonic() - began:.0f} s")  # fmt: skip
        finally:
            if flowing is not None and not flowing.done():
                flowing.cancel()
            if a.poll() is None:
                a.kill()
                a.wait(10)
            await b.stop()
