"""Repair plans for the sample shop's three defects, on a private copy: golden diffs, apply/revert, protection."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from processors.model.outputs import AccessInfo, IncidentEvent
from processors.repair import PatchError, RepairPlan, apply, plan_repairs, revert
from processors.repair.classify import lock_of
from processors.repair.locate import call_sites
from processors.repair.source import SourceIndex
from tests.repair.cases import (
    CAPTURE,
    CHARGE,
    CHECKOUT,
    EXPIRE,
    GOLDEN,
    INSERT_CHARGE,
    INVARIANTS,
    READ_ORDER,
    READ_STOCK,
    SET_STATUS,
    TAKE_UNIT,
    Access,
    daemon_extractor,
    incident,
)

PROTECTED = {"for_update", "atomic", "upsert", "optimistic"}
UPDATE = os.environ.get("REPAIR_GOLDEN_UPDATE") == "1"


def golden(name: str, text: str) -> None:
    """Compare ``text`` with ``golden/<name>`` (rewrite it when REPAIR_GOLDEN_UPDATE=1)."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden file"


def tree_hash(root: Path) -> str:
    """sha256 over every file under ``root`` (paths and bytes)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def plans(plan: RepairPlan) -> list[RepairPlan]:
    return [plan, *plan.alternatives]


@pytest.fixture
def lost_update_plan(shop: Path, lost_update: IncidentEvent, order_sites: list[AccessInfo]) -> RepairPlan:
    return plan_repairs(lost_update, root=shop, sites=order_sites, extractor=daemon_extractor())


@pytest.fixture
def oversell_plan(shop: Path, oversell: IncidentEvent) -> RepairPlan:
    return plan_repairs(oversell, root=shop, invariants=INVARIANTS, extractor=daemon_extractor())


@pytest.fixture
def double_charge_plan(shop: Path, double_charge: IncidentEvent, charge_sites: list[AccessInfo]) -> RepairPlan:
    return plan_repairs(double_charge, root=shop, sites=charge_sites, extractor=daemon_extractor())


def test_lost_update_locks_the_read_of_both_writers(lost_update_plan: RepairPlan) -> None:
    """Lost update: capture_payment and expire_cart both read with FOR UPDATE, edited at the call sites."""
    plan = lost_update_plan
    assert plan.strategy == "row_lock"
    assert [(r.function, r.strategy, r.lock_before, r.lock_after) for r in plan.repairs] == [
        (EXPIRE, "row_lock", "none", "for_update"),
        (CAPTURE, "row_lock", "none", "for_update"),
    ]
    assert {r.file for r in plan.repairs} == {"bench/shop/jobs.py", "bench/shop/handlers.py"}
    assert all(r.statement_after == READ_ORDER + " FOR UPDATE" for r in plan.repairs)
    assert 'READ_ORDER = "SELECT status, version, amount FROM orders WHERE id = %s"\n' not in plan.diff  # shared
    golden("lost_update.diff", plan.diff)


def test_lost_update_alternatives(lost_update_plan: RepairPlan) -> None:
    """Lost update alternatives: an optimistic version check (the version is read) and SERIALIZABLE with retry."""
    alternatives = {a.strategy: a for a in lost_update_plan.alternatives}
    assert list(alternatives) == ["optimistic_version", "stricter_isolation"]
    optimistic = alternatives["optimistic_version"]
    assert {r.lock_after for r in optimistic.repairs} == {"optimistic"}
    assert all(r.statement_after.endswith("AND version = %s RETURNING version") for r in optimistic.repairs)
    golden("lost_update.optimistic_version.diff", optimistic.diff)
    golden("lost_update.stricter_isolation.diff", alternatives["stricter_isolation"].diff)


def test_oversell_becomes_an_atomic_conditional_update(oversell_plan: RepairPlan) -> None:
    """Oversell: the decrement is guarded by ``stock >= 1`` (from ``stock >= 0``) and the None is already handled."""
    plan = oversell_plan
    assert plan.strategy == "atomic_update"
    (repair,) = plan.repairs
    assert (repair.function, repair.lock_before, repair.lock_after) == (CHECKOUT, "none", "atomic")
    assert (
        repair.statement_after == "UPDATE inventory SET stock = stock - 1 WHERE sku = %s AND stock >= 1 RETURNING stock"
    )
    assert "one_row() already handles the None" in plan.diff
    assert [a.strategy for a in plan.alternatives] == ["row_lock", "stricter_isolation"]
    golden("invariant_violation.diff", plan.diff)
    golden("invariant_violation.row_lock.diff", plan.alternatives[0].diff)


def test_double_charge_gets_an_idempotency_guard(double_charge_plan: RepairPlan) -> None:
    """Duplicate apply: the INSERT carries the request's key with ON CONFLICT DO NOTHING, a repeat reads the row."""
    plan = double_charge_plan
    assert plan.strategy == "idempotency_guard"
    assert [(r.function, r.lock_before, r.lock_after) for r in plan.repairs] == [
        (CHARGE, "none", "upsert"),
        (CAPTURE, "none", "upsert"),
    ]
    assert plan.diff.count("ON CONFLICT (idempotency_key) DO NOTHING") == 1  # one helper, edited once
    assert "(order_id, amount, key))" in plan.diff
    assert 'row = cur.execute("SELECT id FROM charges WHERE idempotency_key = %s", (key,))' in plan.diff
    assert [a.strategy for a in plan.alternatives] == ["stricter_isolation"]
    golden("duplicate_apply.diff", plan.diff)


def test_sql_rewrites_golden(
    lost_update_plan: RepairPlan, oversell_plan: RepairPlan, double_charge_plan: RepairPlan
) -> None:
    """The SQL-level equivalents (sqlglot-rendered, postgres, ``%s`` kept) of every plan and alternative."""
    rewrites = {
        f"{p.anomaly}/{p.strategy}": p.sql_rewrites
        for plan in (lost_update_plan, oversell_plan, double_charge_plan)
        for p in plans(plan)
    }
    golden("sql_rewrites.json", json.dumps(rewrites, indent=2, sort_keys=True) + "\n")


def test_every_known_writer_is_repaired(shop: Path, access: Access, order_sites: list[AccessInfo]) -> None:
    """Two racing captures: expire_cart is not in the incident, but the graph knows it writes orders unguarded."""
    reads = [access(CAPTURE, READ_ORDER, "read", t) for t in "ab"]
    accesses = [
        *reads,
        access(CAPTURE, SET_STATUS, "write", "a", at=1),
        access(CAPTURE, SET_STATUS, "write", "b", at=2),
    ]
    event = incident("lost_update", "orders", "orders:7", accesses[2], accesses[3], accesses)
    alone = plan_repairs(event, root=shop)
    assert [r.function for r in alone.repairs] == [CAPTURE]
    known = plan_repairs(event, root=shop, sites=order_sites)
    assert [r.function for r in known.repairs] == [CAPTURE, EXPIRE]
    assert "b/bench/shop/jobs.py" in known.diff
    assert CHECKOUT not in {r.function for r in known.repairs}  # its INSERT creates rows: no read-modify-write


@pytest.mark.parametrize("name", ["lost_update_plan", "oversell_plan", "double_charge_plan"])
def test_apply_then_revert_is_byte_for_byte(shop: Path, name: str, request: pytest.FixtureRequest) -> None:
    """Applying then reverting each plan (and each alternative) restores every file of the copy exactly."""
    original = tree_hash(shop)
    for plan in plans(request.getfixturevalue(name)):
        apply(plan, shop)
        assert tree_hash(shop) != original
        apply(plan, shop)  # idempotent
        revert(plan, shop)
        assert tree_hash(shop) == original
        revert(plan, shop)  # idempotent
        assert tree_hash(shop) == original


def test_patched_code_runs_only_protected_statements(
    shop: Path, lost_update_plan: RepairPlan, oversell_plan: RepairPlan, double_charge_plan: RepairPlan
) -> None:
    """In the patched copy each repaired function runs its statement in the protected form, never the old one."""
    extractor = daemon_extractor()
    for plan in (lost_update_plan, oversell_plan, double_charge_plan):
        apply(plan, shop)
        index = SourceIndex(shop)  # a fresh parse of the patched files
        for repair in plan.repairs:
            path = shop / "bench" / "shop" / f"{repair.function.split('.')[1]}.py"
            assert call_sites(index, path, repair.function, repair.statement_after), repair
            assert not call_sites(index, path, repair.function, repair.statement_before), repair
            assert lock_of(repair.statement_after, extractor) in PROTECTED
            assert lock_of(repair.statement_before, extractor) == "none"
        compile((shop / "bench" / "shop" / "handlers.py").read_text(), "handlers.py", "exec")
        revert(plan, shop)


def test_apply_refuses_a_file_changed_since_planning(shop: Path, oversell_plan: RepairPlan) -> None:
    """A plan never overwrites a file that changed after it was made, and revert never clobbers later edits."""
    handlers = shop / "bench" / "shop" / "handlers.py"
    original = handlers.read_bytes()
    handlers.write_bytes(original + b"# local edit\n")
    with pytest.raises(PatchError):
        apply(oversell_plan, shop)
    handlers.write_bytes(original)
    apply(oversell_plan, shop)
    handlers.write_bytes(handlers.read_bytes() + b"# edited after the repair\n")
    with pytest.raises(PatchError):
        revert(oversell_plan, shop)


def test_recorded_paths_are_mapped_onto_the_root(shop: Path, access: Access) -> None:
    """Paths as production recorded them (/srv/app/...) are read from the copy through ``source_map``."""
    recorded = "/srv/app/bench/shop/handlers.py"
    accesses = [access(CHECKOUT, READ_STOCK, "read", "c", file=recorded),
                access(CHECKOUT, TAKE_UNIT, "write", "c", at=1, file=recorded),
                access(CHECKOUT, TAKE_UNIT, "write", "d", at=2, file=recorded)]  # fmt: skip
    event = incident("invariant_violation", "inventory", "inventory:x", accesses[1], accesses[2], accesses)
    plan = plan_repairs(event, root=shop, invariants=INVARIANTS, source_map={"/srv/app": shop})
    assert [r.file for r in plan.repairs] == ["bench/shop/handlers.py"]
    unmapped = plan_repairs(event, root=shop, invariants=INVARIANTS)
    assert not unmapped.repairs and any("not under the root" in n for n in unmapped.notes)


def test_without_invariant_the_oversell_guard_comes_from_the_decrement(shop: Path, oversell: IncidentEvent) -> None:
    """No configured invariant (the default): the decrement implies ``stock >= 0``, so the guard is ``stock >= 1``,
    the same as with the invariant configured; the note says where it came from."""
    plan = plan_repairs(oversell, root=shop)
    configured = plan_repairs(oversell, root=shop, invariants=INVARIANTS)
    assert [(r.strategy, r.statement_after) for r in plan.repairs] == [
        ("atomic_update", "UPDATE inventory SET stock = stock - 1 WHERE sku = %s AND stock >= 1 RETURNING stock")
    ]
    assert plan.diff == configured.diff
    assert any("stock >= 0, implied by the decrement" in n for n in plan.notes)


def test_an_increment_implies_no_guard(shop: Path, access: Access) -> None:
    """Without an invariant, an UPDATE that only increments has no bound to guard: the row lock repairs it."""
    accesses = [access(CHECKOUT, READ_STOCK, "read", t) for t in "ab"]
    restock = "UPDATE inventory SET stock = stock + 1 WHERE sku = %s"
    accesses += [access(CHECKOUT, restock, "write", "a", at=1), access(CHECKOUT, restock, "write", "b", at=2)]
    event = incident("invariant_violation", "inventory", "inventory:x", accesses[2], accesses[3], accesses)
    plan = plan_repairs(event, root=shop)
    assert [(r.strategy, r.statement_after) for r in plan.repairs] == [("row_lock", READ_STOCK + " FOR UPDATE")]
    assert any("atomic_update does not apply: no invariant configured for the table, and none implied" in n
               for n in plan.notes)  # fmt: skip


def test_duplicate_apply_without_a_key_in_scope_falls_back(shop: Path, access: Access) -> None:
    """checkout's INSERT INTO orders has no idempotency key in scope: it runs at SERIALIZABLE with a retry."""
    insert = "INSERT INTO orders (id, status, amount) VALUES (%s, %s, %s)"
    accesses = [access(CHECKOUT, insert, "insert", "a"), access(CHECKOUT, insert, "insert", "b", at=1)]
    plan = plan_repairs(incident("duplicate_apply", "orders", "orders:1", *accesses, accesses), root=shop)
    assert [r.strategy for r in plan.repairs] == ["stricter_isolation"]
    assert "except psycopg.errors.SerializationFailure:" in plan.diff
    assert plan.sql_rewrites == [{"before": "BEGIN", "after": "BEGIN ISOLATION LEVEL SERIALIZABLE"}]


def test_unknown_anomaly_is_refused(shop: Path, oversell: IncidentEvent) -> None:
    """An anomaly class without strategies is an error, not an empty plan."""
    with pytest.raises(ValueError, match="no repair strategy"):
        plan_repairs(oversell.model_copy(update={"anomaly": "regression"}), root=shop)


def test_repairs_name_the_recorded_statements(lost_update_plan: RepairPlan, double_charge_plan: RepairPlan) -> None:
    """RepairInfo keeps the statement as recorded, so it joins back to the incident's accesses."""
    assert {r.statement_before for r in lost_update_plan.repairs} == {READ_ORDER}
    assert {r.statement_before for r in double_charge_plan.repairs} == {INSERT_CHARGE}
