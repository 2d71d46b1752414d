"""The planned repairs really fix the shop: its own buggy scenarios, on a patched copy, against real PostgreSQL.

Each copy of the shop runs in a subprocess whose ``bench`` package *is* that copy, through
``bench.shop.traffic``'s own rounds (two contenders released together by a ``threading.Barrier`` at their race
points) with a no-op tracer instead of Kafka; the database evidence is ``bench.shop.evidence``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.repair import apply, plan_repairs
from tests.repair.cases import INVARIANTS

pytestmark = pytest.mark.engines

ROUNDS = 8
KINDS = ("lost_update", "oversell", "double_charge")
# A row lock taken before the race point keeps the other contender from reaching it: the barrier then waits for
# its timeout, so the patched lost-update rounds run with a short one.
SCENARIOS = """
import json, sys
from opentelemetry.trace import NoOpTracer
import bench.shop
from bench.shop import db, traffic
from bench.shop.service import Shop

dsn, rounds, kinds = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
traffic.BARRIER_TIMEOUT_S = 1.0
db.apply_schema(dsn)
shop = Shop(dsn, NoOpTracer(), clean=False)
results = {kind: traffic.ROUNDS[kind](shop, dsn, rounds) for kind in kinds}
print(json.dumps({"package": bench.shop.__file__,
                  "results": {k: {"evidence": r.evidence, "statuses": r.statuses} for k, r in results.items()}}))
"""


def run_shop(root: Path, dsn: str, kinds: tuple[str, ...] = KINDS) -> dict[str, dict[str, dict[str, int]]]:
    """Buggy scenarios of the shop copy under ``root``; evidence and answer statuses per scenario."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", SCENARIOS, dsn, str(ROUNDS), ",".join(kinds)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(out["package"]).resolve().is_relative_to(root.resolve()), out["package"]
    results: dict[str, dict[str, dict[str, int]]] = out["results"]
    return results


def assert_fixed(kind: str, result: dict[str, dict[str, int]]) -> None:
    assert result["evidence"]["manifested"] == 0, (kind, result)
    assert all(int(status) < 500 for status in result["statuses"]), (kind, result)


def test_repaired_shop_never_manifests(
    shop: Path,
    postgres_dsn: str,
    lost_update: IncidentEvent,
    oversell: IncidentEvent,
    double_charge: IncidentEvent,
    order_sites: list[AccessInfo],
    charge_sites: list[AccessInfo],
) -> None:
    """Unrepaired, every defect shows; with the three primary plans applied, none does and no request fails."""
    before = run_shop(shop, postgres_dsn)
    for kind, result in before.items():
        assert result["evidence"]["manifested"] >= 1, (kind, result)
    apply(plan_repairs(lost_update, root=shop, sites=order_sites), shop)  # each plan reads the files as they are
    apply(plan_repairs(oversell, root=shop, invariants=INVARIANTS), shop)
    apply(plan_repairs(double_charge, root=shop, sites=charge_sites), shop)
    after = run_shop(shop, postgres_dsn)
    for kind, result in after.items():
        assert_fixed(kind, result)
    lost = after["lost_update"]["evidence"]
    assert lost["lost_cancellations"] == lost["lost_payments"] == 0
    assert after["oversell"]["evidence"]["negative_stock"] == 0
    assert after["double_charge"]["evidence"]["duplicate_charges"] == 0


@pytest.mark.parametrize(
    ("defect", "strategy"),
    [
        ("lost_update", "optimistic_version"),
        ("lost_update", "stricter_isolation"),
        ("oversell", "row_lock"),
        ("oversell", "stricter_isolation"),
        ("double_charge", "stricter_isolation"),
    ],
)
def test_alternative_repairs_also_hold(
    shop: Path,
    postgres_dsn: str,
    request: pytest.FixtureRequest,
    defect: str,
    strategy: str,
    order_sites: list[AccessInfo],
    charge_sites: list[AccessInfo],
) -> None:
    """Each alternative plan, applied alone, also stops its defect without a failed request."""
    event: IncidentEvent = request.getfixturevalue(defect)
    sites = {"lost_update": order_sites, "double_charge": charge_sites}.get(defect, [])
    plan = plan_repairs(event, root=shop, sites=sites, invariants=INVARIANTS)
    (alternative,) = [a for a in plan.alternatives if a.strategy == strategy]
    apply(alternative, shop)
    assert_fixed(defect, run_shop(shop, postgres_dsn, (defect,))[defect])
