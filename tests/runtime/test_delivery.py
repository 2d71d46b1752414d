"""Delivery guarantees on the real engines: replay is harmless, bad input is dead-lettered, outages lose nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from processors.graph.rows import GraphPolicyConfig
from streamer.engines import LocalEngines
from tests.harness import Harness
from tests.otlp_factory import ShopTelemetry, ids, to_proto

pytestmark = pytest.mark.engines

UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


@pytest.fixture(autouse=True)
def _every_span(harness: Harness) -> None:
    """These tests count every span in the graph: delivery, not the detail policy (graph_policy.detail = all)."""
    harness.settings = harness.settings.model_copy(update={"graph_policy": GraphPolicyConfig(detail="all")})


def _messages(n_requests: int, per_message: int = 4, *, start_ns: int | None = None) -> tuple[list[bytes], set[str]]:
    """SDK-encoded TracesData messages; every request touches a row, so every trace is kept in detail."""
    shop = ShopTelemetry()
    base = start_ns or time.time_ns()
    for i in range(n_requests):
        shop.request(f"/orders/{i % 3}", statements=[(UPDATE, f"('paid', {1000 + i})")], function="capture_payment",
                     start_ns=base + i * 3_000_000)  # fmt: skip
    spans = shop.take()
    chunks = [spans[i : i + per_message] for i in range(0, len(spans), per_message)]
    return [to_proto(c) for c in chunks], ids(spans)[1]


async def test_replay_from_zero_leaves_graph_identical(harness: Harness) -> None:
    """A second consumer group replaying the topic from offset 0 into the same graph changes nothing."""
    messages, span_ids = _messages(30)
    await harness.start()
    await harness.produce(harness.settings.kafka.spans_topic, messages)
    await harness.wait_for(harness.drained, "first pass drained")
    await harness.wait_for(lambda: harness.count("MATCH ()-[c:CALLS]->() RETURN count(c)") > 0, "windows")
    first = harness.snapshot()
    assert harness.count("MATCH (s:Span) RETURN count(s)") == len(span_ids)
    await harness.stop()

    kafka = harness.settings.kafka.model_copy(update={"group_id": harness.settings.kafka.group_id + "-replay"})
    harness.settings = harness.settings.model_copy(update={"kafka": kafka})
    await harness.start()
    await harness.wait_for(harness.drained, "replay drained")
    await asyncio.sleep(1.5)  # let the replay's windows close (idle advance) and be rewritten
    await harness.wait_for(harness.drained, "replay drained after windows")
    assert harness.snapshot() == first


async def test_malformed_messages_go_to_dlq_and_good_ones_are_processed(harness: Harness) -> None:
    """Truncated protobuf, empty value, oversize attribute (with ``decode.oversize = "dlq"``; the default cuts it)
    and broken Debezium JSON are dead-lettered, with reasons."""
    decode = harness.settings.decode.model_copy(update={"oversize": "dlq"})
    harness.settings = harness.settings.model_copy(update={"decode": decode})
    good, span_ids = _messages(4, per_message=100)
    shop = ShopTelemetry()
    shop.request("/big", function="big", start_ns=time.time_ns())
    oversize_spans = shop.take()
    huge = oversize_spans[0]
    huge._attributes = {**(huge.attributes or {}), "http.route": "x" * 70_000}  # type: ignore[attr-defined]
    oversize = to_proto(oversize_spans)
    truncated = good[0][: len(good[0]) // 2]
    k = harness.settings.kafka
    cdc_topic = f"cdc{k.group_id.rsplit('-', 1)[1]}.public.orders"
    await harness.create_topics(cdc_topic)
    await harness.start()
    await harness.produce(k.spans_topic, [truncated, good[0], None, oversize])
    await harness.produce(cdc_topic, [b'{"op": "u", "source": {'], key=b'{"id": 1}')
    dlq = await harness.consume_all(k.dlq_topic, expect=4)
    reasons = sorted(dict(m.headers)["reason"].decode() for m in dlq)
    assert reasons == ["debezium_invalid_json", "empty_value", "otlp_proto_invalid", "oversize_attribute"]
    by_reason = {dict(m.headers)["reason"].decode(): m for m in dlq}
    assert by_reason["otlp_proto_invalid"].value == truncated
    assert by_reason["oversize_attribute"].value == oversize
    assert dict(by_reason["otlp_proto_invalid"].headers)["source.topic"] == k.spans_topic.encode()
    assert dict(by_reason["otlp_proto_invalid"].headers)["source.offset"] == b"0"
    assert dict(by_reason["debezium_invalid_json"].headers)["source.topic"] == cdc_topic.encode()
    await harness.wait_for(lambda: harness.count("MATCH (s:Span) RETURN count(s)") == len(span_ids), "good spans")
    assert harness.daemon is not None
    samples = harness.daemon.metrics.registry
    assert samples.get_sample_value("trace_repro_dlq_messages_total", {"reason": "empty_value"}) == 1


async def test_falkordb_outage_loses_nothing_and_duplicates_nothing(harness: Harness, engines: LocalEngines) -> None:
    """FalkorDB stopped mid-stream and restarted: afterwards every span is in the graph exactly once."""
    first, first_ids = _messages(20)
    second, second_ids = _messages(20, start_ns=time.time_ns() + 10_000_000_000)
    await harness.start()
    await harness.produce(harness.settings.kafka.spans_topic, first)
    await harness.wait_for(lambda: harness.count("MATCH (s:Span) RETURN count(s)") == len(first_ids), "first half")
    engines.stop_engine("falkordb")
    try:
        await harness.produce(harness.settings.kafka.spans_topic, second)
        # the daemon consumes, fails to write, and retries with backoff (whichever statement comes first)
        await harness.wait_for(lambda: harness.metric_total("trace_repro_graph_write_retries_total") > 0,
                               "graph write retries while FalkorDB is down", timeout_s=30)  # fmt: skip
    finally:
        engines.up(["falkordb"])
    await harness.wait_for(harness.drained, "drained after outage", timeout_s=120)
    want = len(first_ids | second_ids)
    assert harness.count("MATCH (s:Span) RETURN count(s)") == want
    assert harness.count("MATCH (s:Span) RETURN count(DISTINCT s.id)") == want
    assert harness.count("MATCH (:Span)-[o:OF]->(:Trace) RETURN count(o)") == want
    # no row change is seen here, so the table's key is not known: each UPDATE is one predicate access (never dropped)
    assert harness.count("MATCH (:Span)-[w:WROTE|PREDICATE]->(:Entity) RETURN count(w)") == 40


def test_sigkill_mid_stream_then_restart_loses_and_doubles_nothing(harness: Harness) -> None:
    """The daemon killed with SIGKILL while consuming, then restarted: every span once, every edge once."""
    messages, span_ids = _messages(150, per_message=6)
    s = harness.settings
    env = {
        **os.environ,
        "TRACE_REPRO_KAFKA_BOOTSTRAP": s.kafka.bootstrap,
        "TRACE_REPRO_FALKORDB_URL": s.falkordb.url,
        "TRACE_REPRO_ENVIRONMENT": s.environment,
        "TRACE_REPRO_KAFKA__GROUP_ID": s.kafka.group_id,
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": s.kafka.auto_offset_reset,
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": s.kafka.spans_topic,
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": s.kafka.accesses_topic,
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": s.kafka.dlq_topic,
        "TRACE_REPRO_KAFKA__MAX_POLL_RECORDS": "2",
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2",
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
        "TRACE_REPRO_WINDOWS__IDLE_S": "0.5",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_GRAPH_POLICY__DETAIL": "all",
    }
    asyncio.run(harness.create_topics(s.kafka.spans_topic, s.kafka.logs_topic))
    asyncio.run(harness.produce(s.kafka.spans_topic, messages))
    cmd = [sys.executable, "-m", "streamer.cli", "run"]
    daemon = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while harness.count("MATCH (s:Span) RETURN count(s)") < len(span_ids) // 4:
            assert daemon.poll() is None and time.monotonic() < deadline, "daemon made no progress"
            time.sleep(0.05)
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        partial = harness.count("MATCH (s:Span) RETURN count(s)")
        assert partial < len(span_ids), "killed too late to prove anything"
    finally:
        if daemon.poll() is None:
            daemon.kill()
    restarted = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while harness.count("MATCH (s:Span) RETURN count(s)") < len(span_ids):
            assert restarted.poll() is None and time.monotonic() < deadline, "restart did not finish"
            time.sleep(0.2)
        time.sleep(1.0)  # anything doubled would show up now
        assert harness.count("MATCH (s:Span) RETURN count(s)") == len(span_ids)
        assert harness.count("MATCH (s:Span) RETURN count(DISTINCT s.id)") == len(span_ids)
        assert harness.count("MATCH (:Span)-[c:CHILD_OF]->(:Span) RETURN count(c)") == len(span_ids) - 150
        assert harness.count("MATCH (:Span)-[w:WROTE|PREDICATE]->(:Entity) RETURN count(w)") == 150
        assert harness.count("MATCH (t:Trace) RETURN count(t)") == 150
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(60) == 0
