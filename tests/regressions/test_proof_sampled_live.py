"""A sampled workload on real Kafka: the split service's buggy builds kept always (a consistent probability sampler
writing ``ot=th:0``), the fixed build deployed with head sampling at one half (``ot=th:8``); the judge says
INSUFFICIENT and why, where the same builds unsampled get FIXED (``test_proof_live``)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bench.shop.proof.sampler import ConsistentProbabilitySampler
from bench.shop.proof.traffic import run_scenario
from processors.connectors.proofs.verdicts import INSUFFICIENT, verdicts_by_version
from tests.regressions.test_proof_live import Pipeline, _stream, _topics

pytestmark = pytest.mark.engines

SEQUENCE = (("0.9", 400), ("1.0", 400), ("1.2", 400))


async def test_builds_sampled_differently_get_insufficient_naming_the_sampling(kafka_bootstrap: str) -> None:
    """0.9 and 1.0 kept at 1, 1.2 (the fix) at 0.5: the regression of 1.0 is found as unsampled (every trace kept,
    so the contract is deterministic), but 1.2's error rate cannot be compared with 1.0's: INSUFFICIENT, the reason
    and the receipt say the sampling of each build."""
    tag = uuid.uuid4().hex[:8]
    spans_topic, logs_topic = f"sampled-spans-{tag}", f"sampled-logs-{tag}"
    await _topics(kafka_bootstrap, spans_topic, logs_topic)
    samplers = {"0.9": ConsistentProbabilitySampler(1.0), "1.0": ConsistentProbabilitySampler(1.0),
                "1.2": ConsistentProbabilitySampler(0.5)}  # fmt: skip
    runs = await asyncio.to_thread(run_scenario, kafka_bootstrap, spans_topic=spans_topic, logs_topic=logs_topic,
                                   sequence=SEQUENCE, samplers=dict(samplers))  # fmt: skip
    kept = sum(s.kept_roots for s in samplers.values())
    assert 0 < samplers["1.2"].kept_roots < runs["1.2"].requests  # the half-sampled build lost some
    pipeline = Pipeline(spans_topic)
    await _stream(kafka_bootstrap, pipeline, [spans_topic, logs_topic], 2 * kept, sum(r.rounded for r in runs.values()))
    pipeline.finish()
    assert pipeline.contract is not None, "the regression of 1.0 against 0.9"
    assert verdicts_by_version(pipeline.verdicts) == {"1.2": [INSUFFICIENT]}
    [v] = pipeline.verdicts
    assert v.reason.startswith("sampling differs: 1 on 1.0, 0.5 on 1.2"), v.reason
    assert v.receipt.sampling == {"1.0": "1", "1.2": "0.5"}
