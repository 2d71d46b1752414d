"""A service that never sets service.version, only its commit, gets a verdict across two commits: real spans and
logs through Kafka, the daemon's decoders, trace assembly and proof judge (the pipeline of the proof live test)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from bench.shop.kafka_exporter import KafkaSpanExporter
from bench.shop.proof.service import EVENT, SERVICE, BuildTelemetry, KafkaLogExporter, SplitService, revision_of
from bench.shop.proof.split import BUILDS
from bench.shop.proof.traffic import BuildRun
from processors.connectors.proofs.verdicts import FIXED, verdicts_by_version
from processors.model.contract import ProofContract
from processors.model.units import zero_error_floor
from tests.regressions.test_proof_live import ROUNDING, Pipeline, _stream, _topics

pytestmark = pytest.mark.engines
REQUESTS = 400


def _unversioned(bootstrap: str, version: str, spans_topic: str, logs_topic: str) -> BuildTelemetry:
    """One build's telemetry as a team that never bumps service.version sends it: the commit is all it says."""
    resource = Resource.create({"service.name": SERVICE, "vcs.ref.head.revision": revision_of(version),
                                "deployment.environment.name": "proof"})  # fmt: skip
    spans = TracerProvider(resource=resource)
    spans.add_span_processor(BatchSpanProcessor(KafkaSpanExporter(bootstrap, spans_topic), schedule_delay_millis=100))
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(SimpleLogRecordProcessor(KafkaLogExporter(bootstrap, logs_topic)))
    return BuildTelemetry(version, spans.get_tracer(SERVICE), logs.get_logger(SERVICE), spans, logs)


def _serve(bootstrap: str, spans_topic: str, logs_topic: str) -> dict[str, BuildRun]:
    """The buggy build (1.0), then the fixed one (1.2), one after the other, each under its own commit only."""
    runs: dict[str, BuildRun] = {}
    for version in ("1.0", "1.2"):
        telemetry = _unversioned(bootstrap, version, spans_topic, logs_topic)
        service = SplitService(BUILDS[version], telemetry)
        runs[version] = run = BuildRun(version)
        for j in range(REQUESTS):
            run.serve(service, j)
        run.rounded = service.rounded
        telemetry.shutdown()
    return runs


async def test_a_service_without_service_version_gets_a_verdict_across_two_commits(kafka_bootstrap: str) -> None:
    """The builds are told apart by ``vcs.ref.head.revision``: the fixed commit is FIXED against the buggy one, and
    the receipt says the build was identified by its commit."""
    tag = uuid.uuid4().hex[:8]
    spans_topic, logs_topic = f"proof-commit-spans-{tag}", f"proof-commit-logs-{tag}"
    await _topics(kafka_bootstrap, spans_topic, logs_topic)
    runs = await asyncio.to_thread(_serve, kafka_bootstrap, spans_topic, logs_topic)
    assert runs["1.0"].errors and not runs["1.2"].errors and runs["1.2"].rounded > 0
    pipeline = Pipeline(spans_topic)
    pipeline.judge.on_contract(ProofContract(signature=f"error:*:{ROUNDING}", fingerprint="fp-commit",
                                             must_start=EVENT, watch_s=5.0, min_requests=zero_error_floor(0.05),
                                             service=SERVICE))  # fmt: skip
    spans, logs = 2 * sum(r.requests for r in runs.values()), sum(r.rounded for r in runs.values())
    await _stream(kafka_bootstrap, pipeline, [spans_topic, logs_topic], spans, logs)
    pipeline.finish()
    fixed = revision_of("1.2")
    assert verdicts_by_version(pipeline.verdicts) == {fixed: [FIXED]}
    [verdict] = pipeline.verdicts
    assert verdict.commit == fixed
    assert verdict.receipt.before_errors > 0 and verdict.receipt.must_start_seen > 0
