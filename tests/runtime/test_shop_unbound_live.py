"""The sample shop with statement parameters off (``capture_parameters=False``, psycopg's default), live.

The shop's three defects (an app-computed lost update, an oversell, a double charge) run on PostgreSQL with their
row changes from the real Debezium connector, as in ``test_collisions_live``, but no span carries a statement's
values: the incidents are still found, of their classes, on the right rows, once per round, each saying how its
statements were keyed; the protected code paths stay clean.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bench.shop.telemetry import CAPTURE_PARAMETERS
from streamer.engines import LocalEngines
from tests.runtime.test_collisions_live import ROUNDS, _explain_miss, _incidents, _shop_harness, _traffic

pytestmark = pytest.mark.engines


async def test_shop_defects_found_without_parameters(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each buggy scenario yields its incident on its rows in every round; the incidents carry no parameter and say
    which keys were inferred."""
    monkeypatch.setenv(CAPTURE_PARAMETERS, "0")
    harness = await _shop_harness(engines, kafka_bootstrap, falkordb_url)
    try:
        await harness.start()
        summary = await _traffic(harness, engines, clean=False)
        assert all(r.manifested == ROUNDS for r in summary.results), str(summary)
        want = [["invariant_violation", ROUNDS], ["lost_update", ROUNDS], ["phantom", ROUNDS]]
        try:
            await harness.wait_for(lambda: [r[:2] for r in _incidents(harness)] == want, "three incidents",
                                   timeout_s=90)  # fmt: skip
        except AssertionError:
            await _explain_miss(harness)
            raise
        events = [json.loads(m.value) for m in await harness.consume_all(harness.settings.kafka.incidents_topic,
                                                                          expect=3 * ROUNDS)]  # fmt: skip
        by_class: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_class.setdefault(e["anomaly"], []).append(e)
            parties = [e["culprit"], e["victim"], *e["accesses"]]
            print("incident:", e["anomaly"], e["entity"], e["confidence"], sorted({p["keying"] for p in parties}))
            assert not any(p["params"] for p in parties)
            assert any(p["keying"] != "bound" for p in parties)
        assert {e["entity"] for e in by_class["lost_update"]} == {
            f"orders:{o}" for o in summary.result("lost_update").targets}  # fmt: skip
        assert {e["entity"] for e in by_class["invariant_violation"]} == {
            f"inventory:{s}" for s in summary.result("oversell").targets}  # fmt: skip
        orders = {c["after"]["order_id"] for e in by_class["phantom"] for c in e["commits"]}
        assert orders == set(summary.result("double_charge").targets)
    finally:
        await harness.stop()


async def test_shop_controls_clean_without_parameters(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protected code paths, parameters off, raise no incident."""
    monkeypatch.setenv(CAPTURE_PARAMETERS, "0")
    harness = await _shop_harness(engines, kafka_bootstrap, falkordb_url)
    try:
        await harness.start()
        summary = await _traffic(harness, engines, clean=True)
        assert all(r.manifested == 0 for r in summary.results), str(summary)
        await harness.wait_for(lambda: harness.count("MATCH (t:Trace) RETURN count(t)") >= 3 * ROUNDS, "traces")
        await harness.wait_for(harness.drained, "drained", timeout_s=90)
        await asyncio.sleep(4)  # past the causal window + settle: every entity has been judged
        await harness.wait_for(harness.drained, "judged", timeout_s=90)
        assert _incidents(harness) == []
    finally:
        await harness.stop()
