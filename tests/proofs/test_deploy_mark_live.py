"""A deploy mark through the real daemon: a service whose telemetry names no build at all is split by
``trace-repro deploy mark`` (published on the contracts topic) and gets its verdict; a restart reads the mark again."""

from __future__ import annotations

import json
import time
import uuid

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from processors.connectors.proofs.marks import DeployMark
from processors.model.contract import ProofContract
from streamer.contract_cli import kafka_publish
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, to_proto

S = 1_000_000_000


class RoundingError(Exception):
    """The defect the contract names."""


def _unnamed(service: str) -> ShopTelemetry:
    """The test shop, exporting with a resource that names no build (no version, commit or digest)."""
    shop = ShopTelemetry(service)
    shop.provider = TracerProvider(resource=Resource.create({"service.name": service}))
    shop.provider.add_span_processor(SimpleSpanProcessor(shop.exporter))
    shop.tracer = shop.provider.get_tracer("shop")
    return shop


def _traffic(shop: ShopTelemetry, start_ns: int, n: int, *, buggy: bool) -> list[bytes]:
    out = []
    for j in range(n):
        failing = buggy and j % 10 == 9
        shop.request("/split", error=RoundingError("cents lost") if failing else False, start_ns=start_ns + j * S // 10)
        out.append(to_proto(shop.take()))
    return out


def _marks_read(h: Harness) -> int:
    assert h.daemon is not None
    return h.daemon.metrics.telemetry("proof").events.get("deploy_marks", 0)


async def test_a_marked_deploy_splits_an_unnamed_service_and_survives_a_restart(
    kafka_bootstrap: str, falkordb_url: str
) -> None:
    """Buggy traffic, a mark, clean traffic: FIXED on the mark's build, the receipt says "mark"; after a restart the
    daemon has read the mark again (its record was held uncommitted)."""
    tag = uuid.uuid4().hex[:8]
    service, contracts = f"split-{tag}", f"contracts-{tag}"
    settings = harness_settings(kafka_bootstrap, falkordb_url, PROOF__SETTLE_S="1", KAFKA__CONTRACTS_TOPIC=contracts)
    h = Harness(settings, kafka_bootstrap, falkordb_url)
    t0 = time.time_ns() - 600 * S
    try:
        await h.create_topics(contracts)
        await h.start()
        contract = ProofContract(signature="error:*:RoundingError", fingerprint=f"fp-{tag}", watch_s=60,
                                 min_requests=59, service=service)  # fmt: skip
        mark = DeployMark(service=service, at_unix_ms=(t0 + 30 * S) / 1e6, name="v2")
        for key, event in ((contract.fingerprint, contract), (service, mark)):
            await kafka_publish(kafka_bootstrap, contracts, key.encode(), event.model_dump_json().encode())
        await h.wait_for(lambda: _marks_read(h) == 1, "the desk to read the mark")
        shop = _unnamed(service)
        spans = _traffic(shop, t0, 200, buggy=True) + _traffic(shop, t0 + 30 * S, 300, buggy=False)
        spans += _traffic(shop, t0 + 200 * S, 1, buggy=False)  # event time moves past the watch
        await h.produce(settings.kafka.spans_topic, spans)
        [record] = await h.consume_all(settings.kafka.verdicts_topic, 1, timeout_s=60)
        verdict = json.loads(record.value)
        assert (verdict["service"], verdict["version"], verdict["outcome"]) == (service, "v2", "FIXED")
        assert verdict["receipt"]["build_identified_by"] == "mark" and verdict["receipt"]["before_errors"] == 20
        await h.stop()
        await h.start()  # same group: the contracts partition resumes at the mark it still held
        await h.wait_for(lambda: _marks_read(h) == 1, "the restarted desk to read the mark again")
    finally:
        await h.stop()
