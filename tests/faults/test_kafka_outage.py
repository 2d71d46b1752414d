"""The Kafka broker down for a minute, on the shipped configuration, while traffic with planted lost updates flows.

The daemon (both stages and the GitLab sink, in process, ``config/trace-repro.toml`` as shipped) works through
traffic whose event time runs up to now; a quarter of the way in, the broker is killed (SIGKILL) and stays down for
:data:`OUTAGE_S`, far longer than the producer's request timeout (40 s). The requests made while it is down are
produced once it is back (as a collector that buffered them would), then live traffic follows. Meanwhile the
daemon's Kafka sink, on its own, has a send of 2,000 messages under way (more record batches per partition than the
producer queues at once, whose queueing times out after 40 s): it must wait the outage out and deliver each message
once. The daemon must stay up through the outage and resume: afterwards every trace that touched a row is in the
graph exactly once (the shipped graph policy keeps only those), every planted lost update is one incident occurrence
on the incidents topic and on the graph, and GitLab has one issue per fingerprint counting each occurrence once.
Then the broker is killed again and the daemon is asked to stop: the stop request ends every wait for the broker.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bench.gitlab_server import FakeGitLab
from sinks.kafka import KafkaSink, Message
from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    GITLAB_PROJECT,
    GITLAB_TOKEN,
    MS,
    ROOT_LAG,
    assert_graph_occurrences_once,
    assert_incidents_once,
    assert_one_issue_per_fingerprint,
    cdc_topic,
    graph_counts,
    incident_events,
    live,
    produce,
    tag,
    wait_committed_past,
    wait_issues,
)
from tests.faults.shipped import (
    PathsTraffic,
    assert_paths_exactly_once,
    counted,
    shipped_env,
    shipped_harness,
    wait_paths,
)

pytestmark = pytest.mark.engines

OUTAGE_S = 60.0  # the broker is down this long (its restart comes on top)
BEFORE = (1500, 10, 20.0)  # requests, planted lost updates, ms apart in event time: 30 s up to now
DURING = (600, 6)  # requests and planted lost updates spread over the outage's event time
AFTER_S, AFTER_PER_S = 5.0, 40  # live traffic once the broker is back, a planted lost update every second
PROBE_MESSAGES = 2000  # one send of more record batches per partition than the producer queues at once


async def test_broker_down_a_minute_on_the_shipped_config_loses_and_doubles_nothing(healthy: LocalEngines) -> None:
    """Kafka down 60 s under traffic: the daemon rides it out; every trace touching a row, span and planted
    collision once, one issue per fingerprint."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    began = time.monotonic()
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        h = shipped_harness(shipped_env(kafka, falkordb, gitlab))
        k = h.settings.kafka
        traffic = PathsTraffic(k.spans_topic, cdc_topic(h), root_lag=ROOT_LAG)
        expected = traffic.expected
        try:
            await h.create_topics(k.spans_topic, cdc_topic(h))
            probe_topic = f"probe-{tag()}"
            await h.create_topics(probe_topic, partitions=2)
            await h.start()
            probe = KafkaSink(k)  # the daemon's producer, on its own: a large send under way when the broker dies
            await probe.start()
            probe_messages = [Message(probe_topic, b"k%d" % (i % 40), b"%d" % i) for i in range(PROBE_MESSAGES)]
            requests, collisions, step_ms = BEFORE
            start = time.time_ns() - int(requests * step_ms * MS)
            await produce(kafka, traffic.stream(requests, collisions, start_ns=start, step_ms=step_ms))
            await h.wait_for(lambda: graph_counts(h)[0] >= len(traffic.touching) // 4, "a quarter of the traces", 60)

            healthy.kill("kafka")
            at_kill, killed_ns, down = graph_counts(h)[0], time.time_ns(), time.monotonic()
            assert at_kill < len(traffic.touching), "the broker was killed too late to prove anything"
            requests, collisions = DURING
            during = traffic.stream(requests, collisions, start_ns=killed_ns, step_ms=OUTAGE_S * 1000 / requests)
            sending = asyncio.create_task(probe.send(probe_messages))
            while time.monotonic() - down < OUTAGE_S:  # the outage itself; neither may end meanwhile
                assert h.task is not None
                if h.task.done():
                    h.task.result()
                    raise AssertionError("the daemon stopped while the broker was down")
                if sending.done():
                    sending.result()
                    raise AssertionError("a send returned while the broker was down")
                await asyncio.sleep(0.5)
            await asyncio.to_thread(healthy.restart, "kafka")
            outage_s = time.monotonic() - down
            await sending  # acknowledged once the broker is back: each message once, in order per key
            await probe.close()
            probe_retries = probe.telemetry.events.get("retries", 0)
            probed = [m.value for m in await h.consume_all(probe_topic, expect=PROBE_MESSAGES + 1, timeout_s=10)]
            assert sorted(probed, key=int) == [m.value for m in probe_messages], "a send lost or doubled messages"
            await produce(kafka, during)
            await live(kafka, traffic, seconds=AFTER_S, per_s=AFTER_PER_S, collision_every_s=1.0)

            planted = len(expected.planted)
            await wait_paths(h, traffic, "every trace and incident after the outage", 120)
            await wait_committed_past(h, "every stage committed past its input", 90)
            events = incident_events(await h.consume_all(k.incidents_topic, expect=planted + 1, timeout_s=4))
            await wait_issues(h, gitlab, events)
            await asyncio.sleep(1.0)  # anything filed or written twice would show up now

            assert h.task is not None and not h.task.done(), "the daemon stopped"
            assert_paths_exactly_once(h, traffic)
            assert_incidents_once(events, expected)
            assert_graph_occurrences_once(h, events)
            assert_one_issue_per_fingerprint(gitlab, events)
            summary = counted(h)

            healthy.kill("kafka")  # down again: a stop request ends the daemon, whatever waits for the broker
            await asyncio.sleep(5.0)  # (the daemon runs into the dead broker: a send and a commit wait for it)
            stopping = time.monotonic()
            await h.stop()
            spans = sum(len(ids) for ids in traffic.touching.values())
            print(f"\nbroker down {outage_s:.0f} s (kill to healthy); {len(expected.traces)} requests; in the graph "
                  f"once: {len(traffic.touching)} traces touching a row, {spans} spans; {planted} planted lost "
                  f"updates -> {len(events)} incidents, {len(gitlab.issues())} issue(s); {at_kill} traces in the "
                  f"graph at the kill; the probe's {PROBE_MESSAGES} messages once each after {probe_retries} retries; "
                  f"counted {summary}; stopped {time.monotonic() - stopping:.0f} s after the "
                  f"request with the broker down again; test {time.monotonic() - began:.0f} s")  # fmt: skip
        finally:
            await h.stop()
