"""GREEN on the real PostgreSQL: the Django stack's bug rounds, RED with its own code, GREEN with the ORM-level repair.

Each round runs in a process of its own (``tests.repair.django_rounds``: Django's settings are process-global) on a
copy of the stack's ``app.py``, with the interleaving forced, and the damage is read from PostgreSQL. The incident is
built from the statements the RED round's requests sent (and those are checked to be the unit tests' fixture); the
plan, made from it, is applied to the copy (its migration run on the fresh tables), and the same round is played
again: no damage. The SERIALIZABLE alternative of each plan is played likewise. Every control round is played too,
so the fixture's statements of every view are checked against what Django sends.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from processors.repair import django_orm
from processors.repair.file_patch import FilePatch, apply_files
from processors.repair.patch import Patch
from processors.repair.planner import RepairPlan, apply, plan_repairs, revert
from processors.repair.source import SourceIndex
from processors.repair.strategies import ATOMIC_UPDATE, ROW_LOCK, STRICTER_ISOLATION, UNIQUE_INSERT, Context, Writer
from streamer.engines import LocalEngines
from tests.repair.cases import REPO
from tests.repair.django_cases import VIEWS, copy_stack, recorded, round_incident

pytestmark = pytest.mark.engines

# scenario -> (the plan's strategy, what PostgreSQL shows RED, GREEN; the statuses GREEN, in either order: a repair
# that locks before the race point lets either request take the lock first)
ROUNDS = {
    "lost_update": (ROW_LOCK, 125, 135, [200, 200]),  # balance 100, deposits 10 and 25
    "write_skew": (ROW_LOCK, 0, 1, [200, 409]),  # doctors on call in the shift
    "phantom": (UNIQUE_INSERT, 2, 1, [200, 409]),  # bookings of the room that day
}


def play(
    app: Path, dsn: str, scenario: str, kind: str = "bug", migrations: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    schema = f"django_orm_{uuid.uuid4().hex[:8]}"
    done = subprocess.run([sys.executable, "-m", "tests.repair.django_rounds", str(app), dsn, schema, scenario, kind,
                           *migrations], cwd=REPO, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def green(root: Path, dsn: str, scenario: str, plan: RepairPlan) -> dict[str, Any]:
    original = (root / "app.py").read_bytes()
    apply(plan, root)
    try:
        return play(root / "app.py", dsn, scenario, migrations=list(plan.migrations))
    finally:
        revert(plan, root)
        assert (root / "app.py").read_bytes() == original


@pytest.mark.parametrize("scenario", sorted(ROUNDS))
def test_bug_round_red_then_green_after_the_orm_repair(engines: LocalEngines, tmp_path: Path, scenario: str) -> None:
    dsn = engines.address("postgres")
    root = copy_stack(tmp_path / "stack")
    strategy, red, fixed, statuses = ROUNDS[scenario]
    before = play(root / "app.py", dsn, scenario)
    assert (before["statuses"], before["fact"]) == ([200, 200], red), before  # RED: the damage is in PostgreSQL
    assert before["statements"] == recorded()[scenario]["bug"]  # the unit tests' statements are Django's
    plan = plan_repairs(round_incident(scenario, statements=before["statements"]), root=root)
    assert plan.strategy == strategy and plan.diff, plan.notes
    after = green(root, dsn, scenario, plan)
    assert (sorted(after["statuses"]), after["fact"]) == (statuses, fixed), after
    serializable = next(a for a in plan.alternatives if a.strategy == STRICTER_ISOLATION)
    retried = green(root, dsn, scenario, serializable)
    assert (sorted(retried["statuses"]), retried["fact"]) == (statuses, fixed), retried
    print(
        f"{scenario}: RED {before['statuses']} {red}; GREEN {plan.strategy} {after['statuses']} {after['fact']}; "
        f"GREEN {STRICTER_ISOLATION} {retried['statuses']} {retried['fact']}"
    )


@pytest.mark.parametrize("scenario", sorted(ROUNDS))
def test_the_controls_send_the_recorded_statements(engines: LocalEngines, tmp_path: Path, scenario: str) -> None:
    """The controls' rounds (no damage) send what the unit tests' fixture holds for them."""
    dsn = engines.address("postgres")
    root = copy_stack(tmp_path / "stack")
    for kind in (k for k in VIEWS[scenario] if k != "bug"):
        played = play(root / "app.py", dsn, scenario, kind)
        assert played["fact"] == ROUNDS[scenario][2], played
        assert played["statements"] == recorded()[scenario][kind], kind


def test_atomic_update_of_the_deposit_is_green(engines: LocalEngines, tmp_path: Path) -> None:
    """ATOMIC_UPDATE (the planner's first choice for an invariant violation) on the lost update's deposit: the
    relative UPDATE keeps both deposits."""
    root = copy_stack(tmp_path / "stack")
    found = [a for a in round_incident("lost_update").accesses if a.trace_id.startswith("a")]
    w = Writer("app.deposit", "app.py", root / "app.py", "app.py", tuple(a for a in found if a.operation == "write"),
               tuple(a for a in found if a.operation == "read"))  # fmt: skip
    index = SourceIndex(root)
    patch = Patch(index)
    for op in django_orm.STRATEGIES[ATOMIC_UPDATE](Context(index), w).ops:
        op(patch)
    files = [FilePatch("app.py", before, after) for _, before, after in patch.render()]
    apply_files(files, root)
    played = play(root / "app.py", engines.address("postgres"), "lost_update")
    assert (played["statuses"], played["fact"]) == ([200, 200], 135), played
    relative = 'UPDATE "corpus_accounts" SET "balance" = ("corpus_accounts"."balance" + %s)'
    assert any(s.startswith(relative) for s in played["statements"]["follower"]), played["statements"]
    print(f"lost_update: GREEN {ATOMIC_UPDATE} {played['statuses']} {played['fact']}")
