"""The sample shop's traffic (every buggy scenario and the clean control, on PostgreSQL, exported by its OpenTelemetry
SDK to Kafka) gives no N+1, fan-out or retry finding: its defects are collisions, not performance pathologies."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bench.otlp_gen import Generated
from bench.pertrace_benign import run
from bench.shop.traffic import run_traffic
from streamer.decode import decode_traces_proto
from tests.detectors.shop_spans import is_request, messages

pytestmark = pytest.mark.engines

ROUNDS = 4
SERVERS = 2 * ROUNDS * 5  # per run: lost_update 1 request + 1 job, oversell and double_charge 2 requests each


async def _messages(bootstrap: str, topic: str, servers: int, timeout_s: float = 60) -> list[bytes]:
    """The topic's messages from the start, until they hold ``servers`` server or root spans."""
    values, seen = await messages(bootstrap, topic, servers, counts=is_request, timeout_s=timeout_s)
    assert seen >= servers, (seen, servers)
    return values


async def test_shop_traffic_gives_no_performance_finding(postgres_dsn: str, kafka_bootstrap: str) -> None:
    """Buggy and clean rounds of every scenario through the shipped ingest stage: no finding of the three types."""
    topic = f"shop-silent-{uuid.uuid4().hex[:8]}"
    for scenario in ("all", "control"):
        await asyncio.to_thread(run_traffic, postgres_dsn, kafka_bootstrap, scenario=scenario, rounds=ROUNDS,
                                topic=topic)  # fmt: skip
    messages = await _messages(kafka_bootstrap, topic, SERVERS)
    report = run(Generated(messages=messages, spans=sum(len(decode_traces_proto(m)) for m in messages)))
    assert report["findings"] == {}
    assert all(c.get("windows_closed") for c in report["counted"].values()), report["counted"]
