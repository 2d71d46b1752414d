"""``trace-repro doctor`` on the sample shop, live: PostgreSQL, the real Debezium connector, spans through Kafka.

With statement parameters off (psycopg's default, ``capture_parameters=False``) the doctor says the shop's statements
are unbound and names the fix for Python; with them on it does not. Nothing here starts the daemon.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import pytest

from bench.shop import db
from bench.shop.telemetry import CAPTURE_PARAMETERS
from bench.shop.traffic import run_traffic
from streamer import cli
from streamer.engines import LocalEngines
from streamer.runtime.topics import create_topics
from tests.harness import harness_env

pytestmark = pytest.mark.engines

TABLES = ("orders", "inventory", "charges")


def _doctor(capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    status = cli.main(["doctor", "--from", "beginning", "--seconds", "20", "--json"])
    out = capsys.readouterr()
    return status, json.loads(out.out) if status == 0 else {"error": out.err}


def _finding(report: dict[str, Any], subject: str, capability: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["subject"] == subject and f["capability"] == capability]
    assert len(found) == 1, (subject, capability, report["findings"])
    return found[0]


async def test_doctor_says_the_shops_statements_are_unbound_and_names_the_fix(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """Parameters off: "collisions: statement parameters" is missing for service shop, with psycopg's
    capture_parameters=True as the fix; CDC tables are captured with full before images. Parameters on: ok."""
    prefix = f"d{uuid.uuid4().hex[:8]}"
    env = harness_env(kafka_bootstrap, falkordb_url, kafka__cdc_pattern=rf"^{prefix}\.public\.[a-z]+$")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    spans = env["TRACE_REPRO_KAFKA__SPANS_TOPIC"]
    dsn = engines.address("postgres")
    await asyncio.to_thread(db.apply_schema, dsn)
    await asyncio.to_thread(engines.capture, [f"public.{t}" for t in TABLES], topic_prefix=prefix)
    await create_topics(kafka_bootstrap, dict.fromkeys([spans, *(f"{prefix}.public.{t}" for t in TABLES)], 1))

    monkeypatch.setenv(CAPTURE_PARAMETERS, "0")
    await asyncio.to_thread(run_traffic, dsn, kafka_bootstrap, scenario="all", rounds=1, topic=spans)
    deadline = time.monotonic() + 90
    while True:  # Debezium's changes arrive after the spans: wait for all three tables to be in the sample
        status, report = await asyncio.to_thread(_doctor, capsys)
        assert status == 0, report
        tables = {f["subject"] for f in report["findings"] if f["capability"] == "cdc: captured"
                  and f["status"] == "ok"}  # fmt: skip
        if len(tables) == len(TABLES):
            break
        assert time.monotonic() < deadline, report
        await asyncio.sleep(1)
    params = _finding(report, "service shop", "collisions: statement parameters")
    print(json.dumps(params, indent=1))
    assert params["status"] == "missing"
    assert "carry no parameter values" in params["detail"]
    assert "orders" in params["detail"] and "inventory" in params["detail"]
    assert "capture_parameters=True" in params["fix"] and "java" not in params["fix"]  # the SDK says: python
    assert _finding(report, "service shop", "regressions, verdicts: service.version")["status"] == "ok"
    for t in TABLES:
        before = _finding(report, f"table public.{t} ({prefix}.public.{t})", "cdc: before images")
        assert before["status"] in ("ok", "partial"), before  # the shop's tables are REPLICA IDENTITY FULL
        form = _finding(report, f"table public.{t} ({prefix}.public.{t})", "cdc: converter form")
        assert form["status"] == "ok" and "envelope" in form["detail"]
    orders = f"table public.orders ({prefix}.public.orders)"
    assert _finding(report, orders, "cdc: before images")["status"] == "ok"
    per_table = _finding(report, orders, "collisions: statement parameters")  # the same, per table
    assert per_table["status"] == "missing" and "(from shop)" in per_table["detail"]

    assert await asyncio.to_thread(cli.main, ["doctor", "--from", "beginning", "--seconds", "20"]) == 0  # the table
    table = capsys.readouterr().out
    assert "\nservice shop\n" in table and "MISSING" in table and "fix: psycopg" in table

    spans_on = f"{spans}-on"  # the same shop, parameters on, on spans topic of its own
    await create_topics(kafka_bootstrap, {spans_on: 1})
    monkeypatch.setenv("TRACE_REPRO_KAFKA__SPANS_TOPIC", spans_on)
    monkeypatch.setenv(CAPTURE_PARAMETERS, "1")
    await asyncio.to_thread(run_traffic, dsn, kafka_bootstrap, scenario="all", rounds=1, topic=spans_on)
    status, report = await asyncio.to_thread(_doctor, capsys)
    assert status == 0
    params = _finding(report, "service shop", "collisions: statement parameters")
    assert params["status"] == "ok", params
    assert "every one with its parameter values" in params["detail"]
    assert _finding(report, orders, "collisions: statement parameters")["status"] == "ok"


def test_doctor_without_a_broker_exits_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """No broker: nothing could be read, exit status 2 with a message that says where it looked."""
    monkeypatch.setenv("TRACE_REPRO_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    assert cli.main(["doctor", "--seconds", "1"]) == 2
    assert "cannot reach the Kafka brokers at 127.0.0.1:1" in capsys.readouterr().err


def test_doctor_without_topics_exits_2(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker but none of the configured topics: exit status 2 naming the settings that point nowhere."""
    tag = uuid.uuid4().hex[:8]
    monkeypatch.setenv("TRACE_REPRO_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("TRACE_REPRO_KAFKA__SPANS_TOPIC", f"nospans-{tag}")
    monkeypatch.setenv("TRACE_REPRO_KAFKA__LOGS_TOPIC", f"nologs-{tag}")
    monkeypatch.setenv("TRACE_REPRO_KAFKA__CDC_PATTERN", f"^nocdc{tag}$")
    assert cli.main(["doctor", "--seconds", "1"]) == 2
    err = capsys.readouterr().err
    assert "none of the configured topics exists" in err and f"nospans-{tag}" in err


async def test_doctor_reads_at_most_n_messages_per_topic_from_the_end(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--messages N bounds the sample per topic, spread over its partitions; from the end, the latest are read."""
    from aiokafka import AIOKafkaProducer

    from tests.doctor.test_findings import _traces

    tag = uuid.uuid4().hex[:8]
    spans = f"dspans-{tag}"
    await create_topics(kafka_bootstrap, {spans: 2})
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i in range(20):
            await producer.send_and_wait(spans, _traces("ot=th:8" if i >= 14 else ""), partition=i % 2)
    finally:
        await producer.stop()
    monkeypatch.setenv("TRACE_REPRO_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("TRACE_REPRO_KAFKA__SPANS_TOPIC", spans)
    monkeypatch.setenv("TRACE_REPRO_KAFKA__CDC_PATTERN", f"^nocdc{tag}$")
    status = await asyncio.to_thread(cli.main, ["doctor", "--messages", "6", "--seconds", "20", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["topics"] == {spans: 6}
    sampling = _finding(report, "service api", "sampling: threshold or sampler")  # the last 6: all with th
    assert sampling["status"] == "ok" and sampling["detail"] == "6 of 6 span(s) carry tracestate ot=th:8"
    assert any("no topic matches kafka.cdc_pattern" in n for n in report["notes"])
