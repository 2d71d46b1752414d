"""Proof of fix end to end: the split service's builds export to Kafka; the daemon's decoders, trace assembly,
statistics, regression detector and proof judge turn the real messages into a contract and per-build verdicts."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from bench.shop.proof.service import EVENT, revision_of
from bench.shop.proof.traffic import BuildRun, run_scenario
from processors.connectors.proofs.contracts import contract_from_regression
from processors.connectors.proofs.judge import ProofJudge
from processors.connectors.proofs.verdicts import FIXED, INSUFFICIENT, NOT_FIXED, WORSE, verdicts_by_version
from processors.detectors.regressions.detector import RegressionDetector
from processors.detectors.regressions.stats import ServiceStats
from processors.lib.stat_tests import requests_to_show_drop
from processors.model.contract import ProofContract
from processors.model.outputs import VerdictEvent
from processors.model.regression import RegressionEvent
from processors.model.trace import ClosedTrace
from processors.model.units import zero_error_floor
from processors.pipeline.traces import TraceAssembler
from streamer.decode import decode_logs_proto, decode_traces_proto
from streamer.runtime.topics import create_topics

pytestmark = pytest.mark.engines

MS = 1_000_000
S = 1_000 * MS
ROUNDING = "bench.shop.proof.split.RoundingError"


@dataclass
class Pipeline:
    """Stage 1's event-time path for this feature, without the daemon: spans -> traces -> stats, judge."""

    spans_topic: str
    traces: TraceAssembler = field(default_factory=lambda: TraceAssembler(200 * MS, 100_000, 1_000))
    stats: ServiceStats = field(default_factory=lambda: ServiceStats(S, 200 * MS))
    detector: RegressionDetector = field(default_factory=RegressionDetector)
    judge: ProofJudge = field(default_factory=lambda: ProofJudge(slice_ns=100 * MS))
    watermark: int = 0
    regressions: list[RegressionEvent] = field(default_factory=list)
    contract: ProofContract | None = None
    verdicts: list[VerdictEvent] = field(default_factory=list)
    spans: int = 0
    logs: int = 0

    def feed(self, records: list[ConsumerRecord]) -> None:
        for r in records:
            if r.topic == self.spans_topic:
                spans = decode_traces_proto(r.value)
                self.spans += len(spans)
                self.traces.add(spans)
                self.watermark = max([self.watermark, *(s.end_ns for s in spans)])
            else:
                for record in decode_logs_proto(r.value):
                    self.logs += 1
                    self.judge.on_log(record)
        self._advance(self.traces.close_until(self.watermark), self.watermark)

    def finish(self) -> None:
        """End of input: close everything, then let event time run past every watch."""
        end = self.watermark + 60 * S
        self._advance(self.traces.close_all(), end)

    def _advance(self, closed: list[ClosedTrace], watermark: int) -> None:
        for trace in closed:
            self.stats.add(trace)
            self.judge.on_trace(trace)
        for window in self.stats.close_until(watermark, self.traces.oldest_start()):
            found = self.detector.on_window(window)
            self.regressions += found.regressions
            for event in found.regressions:
                if self.contract is None and event.metric == "errors" and event.signature.endswith(ROUNDING):
                    self.contract = contract_from_regression(event, EVENT, any_route=True, watch_s=5.0)
                    self.judge.on_contract(self.contract)
        self.verdicts += self.judge.close_until(watermark)


async def _topics(bootstrap: str, *names: str) -> None:
    await create_topics(bootstrap, dict.fromkeys(names, 1))


async def _stream(bootstrap: str, pipeline: Pipeline, topics: list[str], spans: int, logs: int) -> None:
    """Consume both topics from the start into ``pipeline`` until every span and log record has arrived."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"proof-{uuid.uuid4().hex[:8]}", enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    try:
        deadline = time.monotonic() + 60
        while (pipeline.spans < spans or pipeline.logs < logs) and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500, max_records=200)
            pipeline.feed([r for rs in batch.values() for r in rs])
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
async def proof(kafka_bootstrap: str) -> tuple[Pipeline, dict[str, BuildRun]]:
    """Run the six builds once against Kafka and stream their telemetry through the pipeline."""
    tag = uuid.uuid4().hex[:8]
    spans_topic, logs_topic = f"proof-spans-{tag}", f"proof-logs-{tag}"
    await _topics(kafka_bootstrap, spans_topic, logs_topic)
    runs = await asyncio.to_thread(run_scenario, kafka_bootstrap, spans_topic=spans_topic, logs_topic=logs_topic)
    pipeline = Pipeline(spans_topic)
    spans, logs = 2 * sum(r.requests for r in runs.values()), sum(r.rounded for r in runs.values())
    await _stream(kafka_bootstrap, pipeline, [spans_topic, logs_topic], spans, logs)
    pipeline.finish()
    return pipeline, runs


def _final(verdicts: list[VerdictEvent]) -> dict[str, VerdictEvent]:
    return {v.version: v for v in verdicts}


def test_the_builds_really_behave_as_designed(proof: tuple[Pipeline, dict[str, BuildRun]]) -> None:
    """1.0 fails on both routes, 1.1 on /split/custom only, 1.3 with KeyError; every span and log arrived."""
    pipeline, runs = proof
    assert set(runs["1.0"].errors) == {("/split/even", "RoundingError"), ("/split/custom", "RoundingError")}
    assert set(runs["1.1"].errors) == {("/split/custom", "RoundingError")}
    assert not runs["1.2"].errors and not runs["1.4"].errors
    assert set(runs["1.3"].errors) == {("/split/custom", "KeyError")}
    assert pipeline.spans == 2 * sum(r.requests for r in runs.values())
    assert pipeline.logs == sum(r.rounded for r in runs.values()) > 0


def test_the_regression_of_1_0_against_0_9_becomes_the_contract(proof: tuple[Pipeline, dict[str, BuildRun]]) -> None:
    """RoundingError is a new signature of 1.0 against 0.9 (exact test); its contract covers every route."""
    pipeline, _ = proof
    rounding = [e for e in pipeline.regressions if e.signature.endswith(ROUNDING)]
    assert {e.operation for e in rounding} == {"/split/even", "/split/custom"}
    assert all(e.version == "1.0" and e.previous_version == "0.9" for e in rounding)
    assert all(e.commit == revision_of("1.0") for e in rounding)
    c = pipeline.contract
    assert c is not None and c.signature == f"error:*:{ROUNDING}" and c.must_start == EVENT
    assert c.baseline_rate is not None and c.min_requests == zero_error_floor(c.baseline_rate)


def test_each_build_gets_its_verdict_with_a_receipt(proof: tuple[Pipeline, dict[str, BuildRun]]) -> None:
    """1.1 NOT_FIXED on /split/custom, 1.2 FIXED, 1.3 WORSE with rollback, 1.4 INSUFFICIENT; 0.9/1.0 not judged."""
    pipeline, runs = proof
    assert pipeline.contract is not None
    outcomes = verdicts_by_version(pipeline.verdicts)
    assert outcomes == {"1.1": [NOT_FIXED], "1.2": [FIXED], "1.3": [WORSE], "1.4": [INSUFFICIENT]}, outcomes
    final = _final(pipeline.verdicts)
    assert all(v.commit == revision_of(v.version) for v in final.values())

    not_fixed = final["1.1"]
    assert not_fixed.receipt.still_happens_at == ["POST /split/custom in shop.proof.split.split_custom"]
    assert 1 <= not_fixed.receipt.after_errors <= runs["1.1"].errors[("/split/custom", "RoundingError")]

    fixed = final["1.2"].receipt
    assert fixed.after_errors == 0 and fixed.floor <= fixed.after_requests <= runs["1.2"].requests
    assert fixed.must_start_seen >= 1 and fixed.before_errors > 0 and fixed.p_value is not None
    assert fixed.p_value <= fixed.alpha / fixed.looks  # significant at its share of alpha

    worse = final["1.3"]
    assert worse.rollback and worse.receipt.after_errors > 0 and worse.receipt.before_errors == 0
    assert worse.receipt.p_value is not None and worse.receipt.p_value <= pipeline.contract.alpha / 2
    assert "signature is gone" in worse.reason and "KeyError" in worse.reason

    low = final["1.4"].receipt  # the clean requests the drop from 1.1's count needs, at alpha / 2
    needed = max(low.floor, requests_to_show_drop(low.before_errors, low.before_requests, low.alpha / 2) or 0)
    assert low.after_requests == runs["1.4"].requests == 20 and low.requests_needed == needed - 20 > 0


def test_the_draining_old_pod_never_counts_against_the_new_build(proof: tuple[Pipeline, dict[str, BuildRun]]) -> None:
    """1.0 requests served during 1.1's rollout (and failing) stay 1.0's: 1.1's receipt never exceeds its own."""
    pipeline, runs = proof
    assert runs["1.0"].requests > 400  # the draining pod did serve during 1.1
    for v in pipeline.verdicts:
        assert v.receipt.after_requests <= runs[v.version].requests
    assert _final(pipeline.verdicts)["1.1"].receipt.after_requests <= runs["1.1"].requests
