"""``trace-repro run --workers 2`` on the split service's builds: each window is tested on both workers' traffic.

The spans are keyed by trace id over two partitions, one per ingest worker, so each worker counts about half of
every window. The regression tests run once, in stage 2, on the shares both workers relayed: a regression's
evidence counts the window's whole traffic (what the graph's STATS edges sum over the two partitions), not one
worker's half, and it is published once per occurrence.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from bench.shop.proof.traffic import run_scenario
from processors.pipeline.requests import operation_key_of
from streamer import config
from streamer.runtime.topics import create_topics
from tests.harness import Harness, harness_env, shipped_event_time
from tests.runtime.test_workers_live import _events, _ready, _spans_owned, _spawn, _tail, _wait

pytestmark = pytest.mark.engines

ROUNDING = "bench.shop.proof.split.RoundingError"
PART_REQUESTS = (
    "MATCH (o:Operation {key: $op})-[x:STATS_PART]->(:Window) WHERE x.window = $window AND x.version = $version "
    "RETURN x.part, x.requests ORDER BY x.part"
)


@pytest.mark.parametrize("event_time", ["shipped", "quick"])
def test_two_workers_regressions_are_tested_on_the_whole_window(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path, event_time: str
) -> None:
    """1.0's RoundingError against 0.9, with the spans split over two workers: both routes' regressions are found,
    each once per occurrence, and each one's evidence counts the requests of both workers' partitions. On the
    shipped event time (60 s windows closed a 10 s trace gap after their end: both builds mostly share a window, the
    version comparison's case) and on quick 1 s windows (the builds in windows of their own, with baselines)."""
    env = harness_env(kafka_bootstrap, falkordb_url, windows__window_s="1", windows__trace_gap_s="0.2")
    if event_time == "shipped":
        env = shipped_event_time(env)
    settings = config.load(None, env=env)
    k = settings.kafka
    asyncio.run(create_topics(k.bootstrap, {k.spans_topic: 2, k.logs_topic: 1}))
    graph = Harness(settings, kafka_bootstrap, falkordb_url)
    log = tmp_path / "daemon.log"
    daemon = _spawn(env, log)
    try:
        _wait(
            "a spans partition for each worker",
            lambda: [len(p) for _, p in sorted(_spans_owned(log, k.spans_topic).items())] == [1, 1],
            daemon,
            log,
        )
        port = next(e["http_port"] for e in _events(log) if e.get("event") == "daemon.starting"
                    and e.get("role") == "supervisor")  # fmt: skip
        _wait("/readyz", lambda: _ready(port), daemon, log)
        run_scenario(k.bootstrap, spans_topic=k.spans_topic, logs_topic=k.logs_topic,
                     sequence=(("0.9", 400), ("1.0", 400)))  # fmt: skip

        def rounding() -> list[dict[str, Any]]:
            values = [json.loads(m.value) for m in asyncio.run(graph.consume_all(k.incidents_topic, 10**6, 3))]
            return [e for e in values if str(e.get("signature", "")).endswith(ROUNDING)]

        _wait("both routes' regressions", lambda: len({e["operation"] for e in rounding()}) == 2, daemon, log, 300)
        found = rounding()
        assert len({e["occurrence"] for e in found}) == len(found), "an occurrence was published twice"
        for event in found:
            assert (event["version"], event["previous_version"]) == ("1.0", "0.9")
            op = operation_key_of(event["service"], event["operation"])
            for evidence in event["evidence"]:
                rows = graph.graph_rows(PART_REQUESTS, {"op": op, "window": evidence["after_window"],
                                                        "version": evidence["after_version"]})  # fmt: skip
                assert len(rows) == 2, f"window {evidence['after_window']} had traffic on one partition: {rows}"
                assert evidence["after_requests"] == sum(n for _, n in rows), (evidence, rows)
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(180)
    assert code == 0, _tail(log)
