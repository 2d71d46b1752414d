"""The shop's planted performance defects, found through the daemon's ingest stage; their fixed builds stay silent.

The shop runs on PostgreSQL and exports its spans with its OpenTelemetry SDK to Kafka, as it always does:
``hang`` (a report query with no timeout while the database stalls) and ``contention`` (invoices serialised on one
lock, at varying concurrency), buggy (v1.0.0) into one topic and fixed (v1.1.0, the controls: the same routes, the
same traffic, a statement timeout and no lock) into another. Each topic goes through a fresh ingest stage built
from the shipped components and the shipped detector settings twice: one message per batch, as a live daemon keeping
up with the shop polls them, and in batches of the shipped ``max_poll_records``, as a daemon catching up on a
backlog reads them (the same findings). Only the event-time windows are shorter (``ENV``: one-second windows and a
short trace gap, as other live tests use), so that a test's seconds of traffic span several windows; no detector
threshold is changed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from bench.shop import invoices, reports
from bench.shop.traffic import CONTENTION, HANG, run_traffic
from processors.detectors.contention import ContentionConfig
from processors.detectors.hangs import HangConfig
from processors.model.finding import FindingEvent
from streamer import config
from streamer.components import default
from streamer.runtime.context import stage_processors
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Record
from tests.detectors.shop_spans import messages

pytestmark = pytest.mark.engines

# Reports at once while the database stalls: the hang detector reports a hop from 3 in a window, and a window's
# edge may fall between their starts (then one window holds 4 or more, or each holds 3).
STALLED = 6
INVOICES = 208  # 16 cycles of the bursts: more than the contention detector's 200 pairs
ENV = {"TRACE_REPRO_WINDOWS__WINDOW_S": "1", "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.5",
       "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0.2", "TRACE_REPRO_WINDOWS__IDLE_S": "30"}  # fmt: skip


async def _messages(bootstrap: str, topic: str, servers: int, timeout_s: float = 60) -> list[bytes]:
    """The topic's messages from the start, until they hold ``servers`` server spans (or the deadline)."""
    values, seen = await messages(bootstrap, topic, servers, timeout_s=timeout_s)
    assert seen >= servers, (seen, servers)
    return values


def _findings(messages: list[bytes], batch: int) -> list[FindingEvent]:
    """Every finding a fresh shipped ingest stage publishes over ``messages``, ``batch`` at a time (0: the shipped
    ``max_poll_records``); then the clock moves on an hour so that every trace and window closes."""
    settings = config.load(None, env={"TRACE_REPRO_KAFKA__SPANS_TOPIC": "shop-perf", **ENV})
    assert settings.section("hangs", HangConfig) == HangConfig()  # the shipped thresholds
    assert settings.section("contention", ContentionConfig) == ContentionConfig()
    now = [time.time_ns()]
    clock, metrics, tracker = (lambda: now[0]), Metrics(), PinTracker()
    processors = stage_processors(settings, metrics, clock, "ingest", tracker, default().factories)
    stage = IngestStage(settings, metrics, clock, tracker=tracker, processors=processors)
    records = [Record(settings.kafka.spans_topic, 0, i, None, m, now[0] // 1_000_000) for i, m in enumerate(messages)]
    batch = batch or settings.kafka.max_poll_records
    events: list[Any] = []
    for i in range(0, len(records), batch):
        events += stage.process(records[i : i + batch]).events
    now[0] += 3600 * 1_000_000_000
    events += stage.process([]).events
    assert len(stage.traces) == 0
    return [e for e in events if isinstance(e, FindingEvent)]


def _run(dsn: str, bootstrap: str, version: str) -> tuple[dict[str, Any], list[FindingEvent]]:
    """Both scenarios as build ``version`` into a fresh topic; their summaries and the stage's findings."""
    topic = f"shop-perf-{uuid.uuid4().hex[:8]}"
    runs = {scenario: run_traffic(dsn, bootstrap, scenario=scenario, rounds=rounds, version=version, topic=topic)
            for scenario, rounds in ((HANG, STALLED), (CONTENTION, INVOICES))}  # fmt: skip
    servers = sum(len(s.result(name).outcomes) for name, s in runs.items())
    messages = asyncio.run(_messages(bootstrap, topic, servers))
    live, backlog = _findings(messages, 1), _findings(messages, 0)
    assert [(f.type, f.fingerprint, sorted(f.traces)) for f in live] == [
        (f.type, f.fingerprint, sorted(f.traces)) for f in backlog
    ]
    return runs, live


def test_the_shop_hang_and_contention_are_found_and_their_fixes_are_silent(postgres_dsn: str,
                                                                         kafka_bootstrap: str) -> None:  # fmt: skip
    buggy, found = _run(postgres_dsn, kafka_bootstrap, "1.0.0")
    fixed, silent = _run(postgres_dsn, kafka_bootstrap, "1.1.0")
    # The shop's own evidence: the buggy reports waited out the stall and the invoices queued; the fixes did not.
    assert buggy[HANG].manifested(HANG) == STALLED and fixed[HANG].manifested(HANG) == 0
    assert fixed[HANG].result(HANG).statuses[504] == STALLED
    assert buggy[CONTENTION].manifested(CONTENTION) >= INVOICES // 4, buggy[CONTENTION]  # bursts of 2 barely wait
    assert fixed[CONTENTION].manifested(CONTENTION) == 0
    # The fixed builds (the same routes, the same traffic) give no finding at all.
    assert silent == [], [(f.type, f.title) for f in silent]
    by_type: dict[str, list[FindingEvent]] = {}
    for f in found:
        by_type.setdefault(f.type, []).append(f)
    assert set(by_type) == {"hang", "contention"}, [(f.type, f.title) for f in found]
    hangs = by_type["hang"]
    assert len({f.fingerprint for f in hangs}) == 1
    for f in hangs:
        data = f.data
        assert (data["service"], data["operation"], data["callee"]) == ("shop", reports.ROUTE, "postgresql"), data
        assert f.remedy == "add_timeout" and data["hung"] >= 3 and data["timeouts"] == 0, data
        assert data["baseline_samples"] >= HangConfig().min_baseline and data["threshold_ms"] >= 5_000, data
        assert min(data["hung_ms"]) >= reports.STALL_S * 1000 and len(data["hung_ms"]) == data["hung"], data
        assert len(f.traces) == data["hung"]
    stalled = {o.trace_id for o in buggy[HANG].result(HANG).outcomes[-STALLED:]}
    hung = [t for f in hangs for t in f.traces]
    assert len(hung) == len(set(hung)) >= STALLED - 2 and set(hung) <= stalled, (hung, stalled)
    contended = by_type["contention"]
    assert len({f.fingerprint for f in contended}) == 1
    for f in contended:
        data = f.data
        assert (data["service"], data["operation"]) == ("shop", invoices.ROUTE), data
        assert f.remedy == "reduce_lock_scope" and data["pairs"] >= ContentionConfig().min_pairs, data
        assert data["windows"] >= 2 and data["rho"] >= 0.4 and data["ratio"] >= 1.5 and data["slope_low"] > 0, data
    invoiced = {o.trace_id for o in buggy[CONTENTION].result(CONTENTION).outcomes}
    assert {t for f in contended for t in f.traces} <= invoiced
