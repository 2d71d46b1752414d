"""A regression reaches people and is closed by proof, end to end: the daemon on the real engines, with the shipped
``config/trace-repro.toml`` (only addresses, topic names and the fake GitLab changed).

An ``orders`` service exports OTLP spans to Kafka through the OpenTelemetry SDK and the shop's Kafka exporter, with
explicit timestamps a quarter of an hour in the past (so that the 60-second statistics windows of the shipped
config close as event time moves, not after minutes of waiting). Build 1.0 is healthy; 2.0 makes ``GET /orders``
four times slower and fails one ``POST /pay`` in ten with ``ValueError``. The daemon detects both regressions
against 1.0, files one issue each on the fake GitLab and makes their automatic contracts. Build 2.1, the fix,
then serves traffic: the proof judge says FIXED on each contract (the error contract by the zero-error floor and
the exact test against 2.0's errors, the latency contract by the share of requests over 1.0's p95 against 2.0's),
each with p <= alpha / looks in its receipt, and the sink closes both issues.

Durations cycle through a fixed spread (no randomness), so windows of one build have the same distribution and
no regression is flagged between them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from bench.gitlab_server import FakeGitLab
from bench.shop.kafka_exporter import KafkaSpanExporter
from processors.connectors.proofs.contracts import parse_signature
from processors.connectors.proofs.verdicts import FIXED, LATENCY_TEST, SIGNATURE_TEST
from processors.lib.stat_tests import conditional_binomial
from processors.model.outputs import VerdictEvent
from sinks.gitlab.markdown import fingerprint_label, fingerprint_of
from streamer import config
from tests.harness import Harness

pytestmark = pytest.mark.engines

CONFIG = Path(__file__).resolve().parents[2] / "config" / "trace-repro.toml"
TOKEN = "glpat-regression-flow"
PROJECT = "trace-repro/orders"
SERVICE = "orders"
S = 1_000_000_000
MS = 1_000_000
WINDOW = 60 * S  # [windows] window_s of the shipped config
SPREAD = [1.0 + 0.025 * i for i in range(20)]  # one request in 20 at each step: p95 = 1.475 x the base


@dataclass(frozen=True)
class Build:
    version: str
    orders_ms: float  # base latency of GET /orders
    fail_every: int  # one POST /pay in this many fails (0: none)


HEALTHY, REGRESSED, FIXED_BUILD = Build("1.0", 20.0, 0), Build("2.0", 80.0, 10), Build("2.1", 18.0, 0)


def serve(bootstrap: str, topic: str, build: Build, start_ns: int, windows: int, per_window: int = 120) -> int:
    """``per_window`` requests of each route per 60 s window over ``windows`` windows, in event-time order; the
    number of spans exported."""
    resource = Resource.create({"service.name": SERVICE, "service.version": build.version,
                                "vcs.ref.head.revision": f"rev-{build.version}"})  # fmt: skip
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(KafkaSpanExporter(bootstrap, topic), schedule_delay_millis=50))
    tracer = provider.get_tracer(SERVICE, build.version)
    step = WINDOW // per_window
    spans = 0
    try:
        for j in range(windows * per_window):
            at = start_ns + j * step
            orders = int(build.orders_ms * SPREAD[j % len(SPREAD)] * MS)
            span = tracer.start_span("GET /orders", kind=SpanKind.SERVER, start_time=at,
                                     attributes={"http.request.method": "GET", "http.route": "/orders",
                                                 "url.path": "/orders", "http.response.status_code": 200})  # fmt: skip
            span.end(end_time=at + orders)
            pay_at = at + step // 2
            fails = build.fail_every > 0 and j % build.fail_every == 3
            span = tracer.start_span("POST /pay", kind=SpanKind.SERVER, start_time=pay_at,
                                     attributes={"http.request.method": "POST", "http.route": "/pay",
                                                 "url.path": "/pay",
                                                 "http.response.status_code": 500 if fails else 200})  # fmt: skip
            if fails:
                span.record_exception(ValueError("card declined twice"), timestamp=pay_at + 4 * MS)
                span.set_status(Status(StatusCode.ERROR, "ValueError: card declined twice"))
                span.set_attribute("error.type", "ValueError")
            span.end(end_time=pay_at + int(10 * SPREAD[j % len(SPREAD)] * MS))
            spans += 2
    finally:
        provider.shutdown()  # exports what is queued
    return spans


def settings(kafka_bootstrap: str, falkordb_url: str, gitlab: FakeGitLab) -> config.CoreSettings:
    """The shipped config file; only where things are (engines, private topics and graph, GitLab) is changed."""
    tag = uuid.uuid4().hex[:8]
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"test_{tag}",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__SPANS_TOPIC": f"spans-{tag}",
        "TRACE_REPRO_KAFKA__LOGS_TOPIC": f"logs-{tag}",
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^cdc{tag}\.[^.]+\.[^.]+$",
        "TRACE_REPRO_KAFKA__ACCESSES_TOPIC": f"accesses-{tag}",
        "TRACE_REPRO_KAFKA__DLQ_TOPIC": f"dlq-{tag}",
        "TRACE_REPRO_KAFKA__INCIDENTS_TOPIC": f"incidents-{tag}",
        "TRACE_REPRO_KAFKA__REPROS_TOPIC": f"repros-{tag}",
        "TRACE_REPRO_KAFKA__VERDICTS_TOPIC": f"verdicts-{tag}",
        "TRACE_REPRO_KAFKA__CONTRACTS_TOPIC": f"contracts-{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_GITLAB__URL": gitlab.url,
        "TRACE_REPRO_GITLAB__PROJECT": PROJECT,
        "TRACE_REPRO_GITLAB_TOKEN": TOKEN,
    }
    return config.load(CONFIG, env=env)


def _verdicts(messages: list[Any]) -> list[VerdictEvent]:
    return [VerdictEvent.model_validate_json(m.value) for m in messages if json.loads(m.value).get("kind") == "verdict"]


async def test_a_regression_is_filed_then_closed_by_a_fixed_verdict_on_the_fixed_build(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """Detected -> filed on GitLab -> the fixed build's traffic -> FIXED with p <= alpha / looks -> issue closed."""
    with FakeGitLab(token=TOKEN, project=PROJECT) as gitlab:
        s = settings(kafka_bootstrap, falkordb_url, gitlab)
        shipped = config.load(CONFIG, env={})
        for section in ("windows", "regressions", "proof", "collisions"):  # the detector settings are the shipped ones
            assert getattr(s, section) == getattr(shipped, section), section
        h = Harness(s, kafka_bootstrap, falkordb_url)
        k = s.kafka
        await h.create_topics(k.contracts_topic)
        now = time.time_ns()
        start = (now - 15 * WINDOW) // WINDOW * WINDOW
        try:
            await h.start()
            await asyncio.to_thread(serve, kafka_bootstrap, k.spans_topic, HEALTHY, start, 3)
            await asyncio.to_thread(serve, kafka_bootstrap, k.spans_topic, REGRESSED, start + 3 * WINDOW, 2)

            def filed() -> list[dict[str, Any]]:
                return [i for i in gitlab.issues() if i["title"].startswith("[trace-repro] Regression: ")]

            await h.wait_for(lambda: len(filed()) >= 2, "both regressions filed", timeout_s=180)
            issues = {("latency" if "latency" in i["title"] else "errors"): i for i in filed()}
            assert len(filed()) == 2 and set(issues) == {"latency", "errors"}, [i["title"] for i in filed()]
            assert all(i["state"] == "opened" for i in issues.values())
            for issue in issues.values():
                text = issue["description"]
                assert "```mermaid\nxychart-beta\n" in text and "### Critical path" in text
                assert "| Owner | Before | After | Delta |" in text  # the critical-path shares table
            assert "Error rate of" in issues["errors"]["description"]
            assert "Latency of" in issues["latency"]["description"]
            labels = {kind: fingerprint_label(str(fingerprint_of(i["description"]))) for kind, i in issues.items()}

            # The fix, deployed now: its traffic over the last three minutes of event time.
            fixed_start = (time.time_ns() - 3 * WINDOW) // MS * MS
            await asyncio.to_thread(serve, kafka_bootstrap, k.spans_topic, FIXED_BUILD, fixed_start, 3)

            def closed() -> bool:
                mine = [gitlab.issues(tag=label) for label in labels.values()]
                return all(len(found) == 1 and found[0]["state"] == "closed" for found in mine)

            await h.wait_for(closed, "both issues closed by FIXED verdicts", timeout_s=240)
            messages = await h.consume_all(k.verdicts_topic, expect=2)
            verdicts = {v.fingerprint: v for v in _verdicts(messages) if v.outcome == FIXED}
            by_kind = {kind: verdicts[label.removeprefix("trace-repro::fp::")] for kind, label in labels.items()}
            assert {v.version for v in by_kind.values()} == {"2.1"}
            assert not [v for v in _verdicts(messages) if v.outcome != FIXED]

            errors = by_kind["errors"]
            r = errors.receipt
            assert errors.contract == "error:POST /pay:ValueError" and r.test == SIGNATURE_TEST
            assert r.before_errors > 0 and r.after_errors == 0 and r.after_requests >= r.floor > 0
            assert r.p_value == conditional_binomial(r.before_errors, r.before_requests, 0, r.after_requests,
                                                     "less").p_value <= r.alpha / r.looks  # fmt: skip

            latency = by_kind["latency"]
            r = latency.receipt
            sig = parse_signature(latency.contract)
            assert latency.contract.startswith("latency:GET /orders:>") and r.test == LATENCY_TEST
            assert r.threshold_ms is not None and 20.0 * SPREAD[-2] <= r.threshold_ms < 80.0  # 1.0's p95, on the grid
            assert str(sig) == latency.contract
            assert r.before_errors == r.before_requests > 0  # every request of 2.0 was over 1.0's p95
            assert r.after_requests >= r.floor and r.after_errors < r.after_requests * 0.05
            assert r.p_value == conditional_binomial(r.before_errors, r.before_requests, r.after_errors,
                                                     r.after_requests, "less").p_value <= r.alpha / r.looks  # fmt: skip
            assert r.baseline_requests and r.baseline_p_value is not None and r.baseline_p_value > r.alpha / r.looks

            for label in labels.values():
                [issue] = gitlab.issues(tag=label)
                notes = [n["body"] for n in gitlab.notes(issue["iid"])]
                assert any("### Verdict: **`FIXED`**" in n for n in notes), notes
            contracts = h.graph_rows("MATCH (c:Contract) RETURN c.fingerprint, c.version")
            assert sorted(contracts) == sorted([fp.removeprefix("trace-repro::fp::"), "2.0"] for fp in labels.values())
        finally:
            await h.stop()
