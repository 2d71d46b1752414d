"""FalkorDB unavailable for a minute while traffic flows, with the daemon on the shipped configuration.

The daemon runs on ``config/trace-repro.toml`` as shipped (graph policy ``paths``, trace gap, lateness, idleness,
windows, polling, retries), with only the addresses and this test's own topics, group and graph set, and the GitLab
sink filing to a local GitLab. Traffic arrives as it happens (event time now: requests on fresh order rows, a
planted lost update every few seconds, Debezium's row changes), before, during and after the outage:

- **down**: FalkorDB is SIGKILLed and stays down for 60 s, then restarts from its append-only file;
- **persistence failing**: FalkorDB's snapshot fails (the disk cannot take its RDB file) and, as it is configured
  by default (``stop-writes-on-bgsave-error yes``), it refuses every write with ``MISCONF`` for 60 s, until a
  snapshot succeeds again.

Nothing is checked by sleeping: afterwards the test counts what reached the graph (every Trace and Span of the
requests the ``paths`` policy details, each once; every CHILD_OF and WROTE edge once; an Occurrence per planted lost
update), the incidents topic (one incident per planted lost update), GitLab (one issue per fingerprint counting each
occurrence once) and the dead-letter topic (empty: no row was refused), after both stages have committed past
everything produced.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bench.gitlab_server import FakeGitLab
from streamer import config
from streamer.engines import LocalEngines
from tests.faults.faultkit import (
    GITLAB_PROJECT,
    GITLAB_TOKEN,
    ROOT_LAG,
    Expected,
    Traffic,
    assert_graph_occurrences_once,
    assert_incidents_once,
    assert_one_issue_per_fingerprint,
    cdc_topic,
    drops,
    incident_events,
    live,
    occurrences,
    wait_committed_past,
    wait_issues,
)
from tests.harness import Harness, harness_env, shipped_event_time

pytestmark = pytest.mark.engines

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "trace-repro.toml"
OUTAGE_S = 60.0
BEFORE_S, AFTER_S = 8.0, 8.0  # traffic before the outage starts and after it ends
RATE = 20  # requests per second (one per 50 ms tick)
COLLISION_EVERY_S = 6.0


def shipped_harness(kafka: str, falkordb: str, gitlab: FakeGitLab) -> Harness:
    """A daemon on the shipped config file: only addresses, this test's names and the GitLab sink's target set."""
    env = shipped_event_time(harness_env(kafka, falkordb))
    env.pop("TRACE_REPRO_KAFKA__ACCESSES_PARTITIONS")  # as shipped too
    env |= {"TRACE_REPRO_GITLAB__URL": gitlab.url, "TRACE_REPRO_GITLAB__PROJECT": GITLAB_PROJECT,
            "TRACE_REPRO_GITLAB_TOKEN": GITLAB_TOKEN}  # fmt: skip
    settings = config.load(SHIPPED, env=env)
    assert settings.graph_policy.detail == "paths" and settings.windows.trace_gap_s == 10
    return Harness(settings, kafka, falkordb)


@dataclass(frozen=True)
class Detailed:
    """What the ``paths`` policy puts in the graph of the produced traffic: the traces that touch a row (all of their
    spans are the access spans and their ancestors), their spans and parent edges."""

    traces: set[str]
    spans: set[str]
    child_of: set[tuple[str, str]]
    writes: int

    @classmethod
    def of(cls, expected: Expected) -> Detailed:
        traces = {t for t, (route, _) in expected.traces.items() if route != "/products"}
        edges = {(c, p) for c, (p, t) in expected.parents.items() if t in traces}
        return cls(traces, {c for c, _ in edges} | {p for _, p in edges}, edges, expected.writes)


def counted(h: Harness) -> dict[str, Counter[str]]:
    """Each Trace id, Span id and (child, parent) CHILD_OF pair in the graph, with how many times it is there."""
    return {
        "traces": Counter(r[0] for r in h.graph_rows("MATCH (t:Trace) RETURN t.id")),
        "spans": Counter(r[0] for r in h.graph_rows("MATCH (s:Span) RETURN s.id")),
        "child_of": Counter(
            f"{r[0]}>{r[1]}" for r in h.graph_rows("MATCH (c:Span)-[:CHILD_OF]->(p:Span) RETURN c.id, p.id")
        ),
    }


async def wait_graph(h: Harness, want: Detailed, expected: Expected, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        traces = len(counted(h)["traces"])
        if traces >= len(want.traces) and occurrences(h) >= len(expected.planted):
            return
        if h.task is not None and h.task.done():
            h.task.result()
        assert time.monotonic() < deadline, (
            f"timed out: {traces} of {len(want.traces)} detailed traces in the graph, {occurrences(h)} occurrences for "
            f"{len(expected.planted)} planted lost updates; drops {drops(h)}"
        )
        await asyncio.sleep(0.5)


def assert_graph_once(h: Harness, want: Detailed) -> dict[str, int]:
    """Every detailed trace, span and parent edge once, nothing else; a WROTE edge per write."""
    got = counted(h)
    twice = {kind: [k for k, n in c.items() if n > 1][:3] for kind, c in got.items()}
    assert not any(twice.values()), f"in the graph twice: {twice}"
    assert set(got["traces"]) == want.traces, (len(want.traces - set(got["traces"])), len(set(got["traces"])))
    assert set(got["spans"]) == want.spans, (len(want.spans - set(got["spans"])), len(set(got["spans"]) - want.spans))
    assert set(got["child_of"]) == {f"{c}>{p}" for c, p in want.child_of}
    wrote = h.count("MATCH (:Span)-[w:WROTE]->(:Entity) RETURN count(w)")
    assert wrote == want.writes
    return {"traces": len(got["traces"]), "spans": len(got["spans"]), "child_of": len(got["child_of"]),
            "wrote": wrote}  # fmt: skip


async def outage_under_traffic(healthy: LocalEngines, begin: Callable[[], None], end: Callable[[], Awaitable[None]],
                               what: str) -> None:  # fmt: skip
    """The daemon on the shipped config with live traffic; ``begin`` the outage after BEFORE_S, keep it OUTAGE_S,
    ``end`` it; then count everything (module docstring)."""
    kafka, falkordb = healthy.address("kafka"), healthy.address("falkordb")
    with FakeGitLab(token=GITLAB_TOKEN, project=GITLAB_PROJECT) as gitlab:
        h = shipped_harness(kafka, falkordb, gitlab)
        k = h.settings.kafka
        traffic = Traffic(k.spans_topic, cdc_topic(h), root_lag=ROOT_LAG)
        expected = traffic.expected
        try:
            await h.create_topics(k.spans_topic, cdc_topic(h), k.dlq_topic)
            await h.start()
            flowing = asyncio.create_task(live(kafka, traffic, seconds=BEFORE_S + OUTAGE_S + AFTER_S, per_s=RATE,
                                               collision_every_s=COLLISION_EVERY_S))  # fmt: skip
            await asyncio.sleep(BEFORE_S)  # traffic before the outage
            await asyncio.to_thread(begin)
            began = time.monotonic()
            await h.wait_for(lambda: h.metric_total("trace_repro_graph_write_retries_total") > 0,
                             f"graph writes retried while FalkorDB is {what}", OUTAGE_S)  # fmt: skip
            await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - began)))  # the outage lasts a minute
            retried = h.metric_total("trace_repro_graph_write_retries_total")
            await end()
            outage_s = time.monotonic() - began
            await flowing
            want = Detailed.of(expected)
            await wait_graph(h, want, expected)
            await wait_committed_past(h, "every stage committed past its input", timeout_s=120)
            events = incident_events(await h.consume_all(k.incidents_topic, expect=len(expected.planted) + 1,
                                                         timeout_s=4))  # fmt: skip
            await wait_issues(h, gitlab, events)
            dead = await h.consume_all(k.dlq_topic, expect=1, timeout_s=2)

            graph = assert_graph_once(h, want)
            assert_incidents_once(events, expected)
            assert_graph_occurrences_once(h, events)
            assert_one_issue_per_fingerprint(gitlab, events)
            assert dead == [], [dict(m.headers) for m in dead[:3]]
            assert h.metric_total("trace_repro_graph_rows_rejected_total") == 0
            print(f"\nFalkorDB {what} for {outage_s:.0f} s: produced {len(expected.traces)} requests, "
                  f"{len(expected.planted)} planted lost updates; graph {graph}; incidents {len(events)}; "
                  f"issues {len(gitlab.issues())}; dead letters {len(dead)}; "
                  f"graph write retries {retried:.0f}")  # fmt: skip
        finally:
            await h.stop()


async def test_falkordb_down_for_a_minute_on_the_shipped_config(healthy: LocalEngines) -> None:
    """FalkorDB SIGKILLed for 60 s under traffic, then restarted: everything once in the graph and the sinks."""

    async def restart() -> None:
        await asyncio.to_thread(healthy.restart, "falkordb")

    await outage_under_traffic(healthy, lambda: healthy.kill("falkordb"), restart, "down")


def persistence(healthy: LocalEngines, *, failing: bool) -> None:
    """Make FalkorDB's snapshots fail (a directory where its RDB file goes: the rename that ends a BGSAVE fails, as
    on a full or read-only disk) or succeed again, run a BGSAVE and wait for its outcome."""
    state = healthy.engines["falkordb"]
    blocker = Path(state.data_dir) / "dump.rdb"
    if failing:
        if blocker.is_file():  # a snapshot an earlier stop saved
            blocker.unlink()
        (blocker / "in-the-way").mkdir(parents=True, exist_ok=True)
    else:
        shutil.rmtree(blocker, ignore_errors=True)
    control = redis.Redis(port=state.port)
    try:
        deadline = time.monotonic() + 30
        while control.info("persistence")["rdb_bgsave_in_progress"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        control.bgsave()
        while control.info("persistence")["rdb_bgsave_in_progress"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert control.info("persistence")["rdb_last_bgsave_status"] == ("err" if failing else "ok")
        if failing:
            with pytest.raises(redis.ResponseError, match=r"^MISCONF"):
                control.execute_command("GRAPH.QUERY", "misconf_probe", "CREATE (:Probe)")
    finally:
        control.close()


async def test_falkordb_refusing_writes_for_a_minute_misconf_on_the_shipped_config(healthy: LocalEngines) -> None:
    """FalkorDB's persistence failing for 60 s under traffic (every write refused with MISCONF), then recovering:
    nothing dropped, nothing dead-lettered, everything once in the graph and the sinks."""

    async def recover() -> None:
        await asyncio.to_thread(persistence, healthy, failing=False)

    try:
        await outage_under_traffic(healthy, lambda: persistence(healthy, failing=True), recover, "refusing writes")
    finally:
        persistence(healthy, failing=False)
