"""The repaired shop under the same concurrent traffic yields no new incident, through the whole daemon."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from processors.model.outputs import IncidentEvent
from processors.repair import apply, plan_repairs
from streamer.engines import LocalEngines
from tests.runtime.test_collisions_live import ROUNDS, _incidents, _shop_harness

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "repro" / "golden" / "incidents"


def _repaired_copy(tmp: Path) -> Path:
    """bench/ copied, with the planned repair of each of the three recorded incidents applied in turn."""
    copy = tmp / "shop-1.1.0"
    shutil.copytree(REPO / "bench", copy / "bench", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("lost_update", "invariant_violation", "duplicate_apply"):
        incident = IncidentEvent.model_validate_json((GOLDEN / f"{name}.json").read_text())
        recorded = str(Path(incident.culprit.file).parents[2])  # the checkout the spans were recorded from
        plan = plan_repairs(incident, root=copy, invariants={"inventory": ["stock >= 0"]},
                            source_map={recorded: copy})  # fmt: skip
        assert plan.repairs, f"no repair planned for {name}: {plan.notes}"
        apply(plan, copy)
    return copy


async def test_repaired_shop_raises_no_incident(
    engines: LocalEngines, kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """The buggy scenarios run on the repaired code as v1.1.0: no defect manifests and the daemon files nothing."""
    copy = _repaired_copy(tmp_path)
    harness = await _shop_harness(engines, kafka_bootstrap, falkordb_url)
    try:
        await harness.start()
        cmd = [sys.executable, "-m", "bench.shop", "--dsn", engines.address("postgres"), "--kafka", kafka_bootstrap,
               "--scenario", "all", "--rounds", str(ROUNDS), "--version", "1.1.0",
               "--topic", harness.settings.kafka.spans_topic, "--json"]  # fmt: skip
        # The repaired code locks before its race point: the traffic's barrier then waits inside the locked section,
        # and a long one would hold the row lock as no request does (the daemon rightly files those waits as
        # blocked-by); 50 ms stays below the lock waits it names.
        env = {**os.environ, "PYTHONPATH": str(copy), "SHOP_BARRIER_TIMEOUT_S": "0.05"}
        run = await asyncio.to_thread(subprocess.run, cmd, env=env, cwd=copy, capture_output=True, text=True,
                                      timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        summary = json.loads(run.stdout)
        assert [s["manifested"] for s in summary["scenarios"]] == [0, 0, 0], run.stdout
        assert all(code < 500 for s in summary["scenarios"] for code in map(int, s["statuses"])), run.stdout
        await harness.wait_for(lambda: harness.count("MATCH (t:Trace) RETURN count(t)") >= 3 * ROUNDS, "traces")
        await harness.wait_for(harness.drained, "drained", timeout_s=90)
        await asyncio.sleep(4)  # past the causal window + settle: every entity has been judged
        await harness.wait_for(harness.drained, "judged", timeout_s=90)
        assert _incidents(harness) == []
        locks = {r[0] for r in harness.graph_rows("MATCH ()-[x:READ|WROTE]->() RETURN DISTINCT x.lock")}
        assert {"for_update", "atomic", "upsert"} <= locks  # the repaired statements, as the daemon classifies them
    finally:
        await harness.stop()
