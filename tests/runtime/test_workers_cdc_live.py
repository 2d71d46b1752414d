"""``trace-repro run --workers 2`` on the sample shop: spans and row changes split over two ingest workers.

The sample shop runs its three defects against PostgreSQL; Debezium streams the row changes, the OTel exporter the
spans. Stage 1 runs as two processes of one consumer group, so the row changes of a table are read by one worker
and the spans that made them, in part, by the other; the worker reading the orders table's changes is SIGKILLed
while the traffic runs and replaced by the supervisor. Every defect must still be found in every round: stage 2's
event time waits for the row changes the dead worker had not delivered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.shop import db
from bench.shop.evidence import Summary
from bench.shop.traffic import run_traffic
from streamer import config
from streamer.engines import LocalEngines
from streamer.runtime.topics import create_topics
from tests.harness import Harness, harness_env, shipped_event_time
from tests.runtime.test_workers_live import _consumed, _events, _ready, _scrape, _spawn, _tail, _wait, _worker_pids

pytestmark = pytest.mark.engines

ROUNDS = 3
TABLES = ("orders", "inventory", "charges")


def _owners(log: Path) -> dict[int, set[str]]:
    """Every input partition each ingest worker holds now (its latest assignment)."""
    owned: dict[int, set[str]] = {}
    for e in _events(log):
        if e.get("event") == "partitions.assigned" and e.get("role") == "ingest":
            owned[e["worker"]] = set(e["partitions"])
    return owned


@pytest.mark.parametrize("event_time", ["shipped", "quick"])
def test_two_workers_find_every_defect_when_the_row_change_worker_is_killed(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, tmp_path: Path, event_time: str
) -> None:
    """Three rounds of the three defects with the worker owning the orders table's row changes killed once it has
    read some: each defect is found in each round, once, and the daemon drains and exits 0. Event time runs on the
    shipped defaults (trace gap, lateness, idleness, windows: what users run) and on the harness's quick ones (the
    promises move in sub-second steps: a promise raised past the replay showed there, in 3 runs of 7)."""
    prefix = f"w{uuid.uuid4().hex[:8]}"
    env = harness_env(kafka_bootstrap, falkordb_url, kafka__cdc_pattern=rf"^{prefix}\.public\.[a-z]+$",
                      collisions__invariants=json.dumps({"inventory": ["stock >= 0"]}))  # fmt: skip
    if event_time == "shipped":
        env = shipped_event_time(env)
    settings = config.load(None, env=env)
    k = settings.kafka
    dsn = engines.address("postgres")
    db.apply_schema(dsn)
    engines.capture([f"public.{t}" for t in TABLES], topic_prefix=prefix)
    cdc = [f"{prefix}.public.{t}" for t in TABLES]
    asyncio.run(create_topics(k.bootstrap, {k.spans_topic: 2, k.logs_topic: 1, **dict.fromkeys(cdc, 1)}))
    graph = Harness(settings, kafka_bootstrap, falkordb_url)
    log = tmp_path / "daemon.log"
    daemon = _spawn(env, log)
    try:
        inputs = {f"{t}/0" for t in cdc} | {f"{k.spans_topic}/{p}" for p in range(2)}

        def shared() -> bool:  # both workers hold some input, together all of it
            owned = _owners(log)
            mine, theirs = owned.get(0, set()) & inputs, owned.get(1, set()) & inputs
            return bool(mine and theirs) and mine | theirs == inputs and not mine & theirs

        _wait("both workers to share the inputs", shared, daemon, log)
        port = next(e["http_port"] for e in _events(log) if e.get("event") == "daemon.starting"
                    and e.get("role") == "supervisor")  # fmt: skip
        _wait("/readyz", lambda: _ready(port), daemon, log)
        victim = next(w for w, parts in _owners(log).items() if f"{cdc[0]}/0" in parts)
        victim_port = next(e["http_port"] for e in _events(log) if e.get("event") == "worker.listening"
                           and e["role"] == "ingest" and e["worker"] == victim)  # fmt: skip

        done: list[Summary] = []
        traffic = threading.Thread(
            target=lambda: done.append(
                run_traffic(dsn, k.bootstrap, scenario="all", rounds=ROUNDS, topic=k.spans_topic)
            )
        )
        traffic.start()
        _wait("the orders worker reading row changes", lambda: _consumed(victim_port, cdc[0]) >= 1, daemon, log)
        os.kill(_worker_pids(log)[("ingest", victim)][-1], signal.SIGKILL)
        traffic.join(300)
        [summary] = done
        assert all(r.manifested == ROUNDS for r in summary.results), str(summary)
        _wait("a replacement for the killed worker", lambda: len(_worker_pids(log)[("ingest", victim)]) == 2,
              daemon, log)  # fmt: skip

        want = [["invariant_violation", ROUNDS], ["lost_update", ROUNDS], ["phantom", ROUNDS]]

        def incidents() -> list[list[Any]]:
            return graph.graph_rows("MATCH (i:Incident) RETURN i.class, i.occurrences ORDER BY i.class")

        try:
            _wait("every defect in every round", lambda: incidents() == want, daemon, log, 180)
        except AssertionError as exc:
            raise AssertionError(f"found {incidents()}, want {want}\n{exc}") from None
        assert f'trace_repro_worker_restarts_total{{role="ingest",worker="{victim}"}} 1.0' in _scrape(port, "/metrics")
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
        code = daemon.wait(180)
    assert code == 0, _tail(log)
