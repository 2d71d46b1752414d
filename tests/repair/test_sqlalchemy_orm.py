"""Repairs of SQLAlchemy code: the flask_sqlalchemy stack's bugs, as the daemon records them, get ORM-level edits.

Each bug view's incident (two requests, SQLAlchemy's own statement text, no parameters, the code located to the
view) is planned against a private copy of the stack's ``app.py``: the raw-SQL form cannot find a statement the
code never writes as a string, so the SQLAlchemy form repairs it (golden diffs), with its SQL-level form alongside;
every plan applies and reverts byte for byte; the controls (the views already protected) are left alone.
``test_sqlalchemy_orm_live`` runs the patched copies against PostgreSQL.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.dialects import postgresql

from processors.model.outputs import AccessInfo
from processors.repair import apply, plan_repairs, revert, sqlalchemy_orm
from processors.repair.classify import lock_of, table_of
from processors.repair.patch import Patch
from processors.repair.planner import RepairPlan
from processors.repair.source import SourceIndex
from processors.repair.sql_inserts import equality_columns
from processors.repair.strategies import (
    ATOMIC_UPDATE,
    OPTIMISTIC_VERSION,
    ROW_LOCK,
    SHARE_LOCK,
    STRATEGIES,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    Writer,
    runs_serializable,
)
from tests.repair.cases import incident
from tests.repair.sqla_cases import path_accesses, recorded, stack_copy, stack_incident
from tests.repair.test_repair_shop import golden

BUGS = {"lost_update": ROW_LOCK, "write_skew": ROW_LOCK, "phantom": UNIQUE_INSERT}
OFFERED = {"lost_update": [OPTIMISTIC_VERSION, STRICTER_ISOLATION], "write_skew": [STRICTER_ISOLATION],
           "phantom": [STRICTER_ISOLATION]}  # fmt: skip
CONTROLS = [key.split("/") for key in recorded() if "/control:" in key]
CORE_BANK = Path(__file__).with_name("fixtures") / "core_bank" / "bank.py"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return stack_copy(tmp_path)


def every_plan(plan: RepairPlan) -> list[RepairPlan]:
    return [plan, *plan.alternatives]


def test_sqlalchemys_text_is_read_as_the_daemon_reads_it() -> None:
    """Named placeholders (``%(pk_1)s``) and cast values (``%(day_1)s::VARCHAR``), as SQLAlchemy renders them."""
    statements = recorded()
    read = statements["lost_update/bug"]["statements"][0]  # type: ignore[index]
    locked = statements["lost_update/control:for_update"]["statements"][0]  # type: ignore[index]
    lookup = statements["phantom/bug"]["statements"][0]  # type: ignore[index]
    assert (table_of(read), lock_of(read), lock_of(locked)) == ("corpus_accounts", "none", "for_update")
    assert equality_columns(lookup) == ["room", "day"]


@pytest.mark.parametrize("anomaly", list(BUGS))
def test_each_bug_is_repaired_by_an_orm_edit(root: Path, anomaly: str) -> None:
    plan = plan_repairs(stack_incident(anomaly, "bug", root), root=root)
    assert plan.strategy == BUGS[anomaly]
    assert {r.function for r in plan.repairs} == {f"app.{recorded()[f'{anomaly}/bug']['view']}"}
    golden(f"sqlalchemy.{anomaly}.diff", plan.diff)
    assert [a.strategy for a in plan.alternatives] == OFFERED[anomaly]
    for alternative in plan.alternatives:
        golden(f"sqlalchemy.{anomaly}.{alternative.strategy}.diff", alternative.diff)
    serializable = plan.alternatives[-1]
    assert serializable.isolation == {plan.repairs[0].function: "serializable"}


def test_the_sql_level_forms_go_with_the_orm_edits(root: Path) -> None:
    """What a SQL-level repro replays: the recorded statement → the repaired one, and the migration."""
    lost = plan_repairs(stack_incident("lost_update", "bug", root), root=root)
    [edit] = lost.edits
    assert edit.before == recorded()["lost_update/bug"]["statements"][0]  # type: ignore[index]
    assert edit.after == edit.before + " FOR UPDATE"
    skew = plan_repairs(stack_incident("write_skew", "bug", root), root=root)
    count = skew.edits[0]
    assert count.before.startswith("SELECT count(*)") and ") AS corpus_doctors" in count.after
    assert "FOR UPDATE)" in count.after  # the aggregate reads its rows through a locking subquery
    [versioned] = [a for a in lost.alternatives if a.strategy == OPTIMISTIC_VERSION]
    assert versioned.migrations == ["ALTER TABLE corpus_accounts ADD COLUMN version integer NOT NULL DEFAULT 1"]
    assert versioned.edits == []  # SQLAlchemy binds the version: no SQL-level form with named placeholders
    phantom = plan_repairs(stack_incident("phantom", "bug", root), root=root)
    assert phantom.migrations == ["CREATE UNIQUE INDEX IF NOT EXISTS corpus_bookings_room_day_key ON "
                                  "corpus_bookings(room, day)"]  # fmt: skip
    [insert] = phantom.edits
    assert " ON CONFLICT (room, day) DO NOTHING RETURNING " in insert.after


@pytest.mark.parametrize("anomaly", list(BUGS))
def test_every_plan_applies_and_reverts_byte_for_byte(root: Path, anomaly: str) -> None:
    source = root / "app.py"
    original = source.read_bytes()
    for plan in every_plan(plan_repairs(stack_incident(anomaly, "bug", root), root=root)):
        apply(plan, root)
        patched = source.read_bytes()
        assert patched != original
        compile(patched, str(source), "exec")
        revert(plan, root)
        assert source.read_bytes() == original


def test_the_raw_sql_form_finds_no_statement_in_orm_code(root: Path) -> None:
    incident = stack_incident("lost_update", "bug", root)
    reads = tuple(a for a in incident.accesses if a.operation == "read" and a.trace_id == incident.victim.trace_id)
    w = Writer("app.deposit", "app.py", root / "app.py", "app.py", (incident.victim,), reads)
    with pytest.raises(NotApplicable, match=r"not found in app\.deposit"):
        STRATEGIES[ROW_LOCK](Context(index=SourceIndex(root)), w)


@pytest.mark.parametrize(("anomaly", "kind"), CONTROLS, ids=[f"{a}-{k}" for a, k in CONTROLS])
def test_a_control_is_left_alone(root: Path, anomaly: str, kind: str) -> None:
    """As the incident's own parties, or as code paths the graph knows beside the bug's."""
    plan = plan_repairs(stack_incident(anomaly, kind, root), root=root)
    assert (plan.repairs, plan.diff) == ([], "")
    sites = path_accesses(f"{anomaly}/{kind}", "c", root)
    beside = plan_repairs(stack_incident(anomaly, "bug", root), root=root, sites=sites)
    assert beside.diff == plan_repairs(stack_incident(anomaly, "bug", root), root=root).diff
    assert {r.function for r in beside.repairs} == {f"app.{recorded()[f'{anomaly}/bug']['view']}"}


def test_serializable_set_through_sqlalchemy_counts_as_serializable(root: Path) -> None:
    index = SourceIndex(root)
    assert runs_serializable(index, root / "app.py", "app.go_off_call_serializable")
    assert not runs_serializable(index, root / "app.py", "app.go_off_call")


def test_an_invariant_violation_gets_the_guarded_atomic_update(root: Path) -> None:
    """The deposit as an invariant violation: the attribute change becomes ``update(...).values(...)`` guarded by the
    configured invariant, its "no row" path raising; without an invariant an increment is not guarded."""
    incident = stack_incident("lost_update", "bug", root).model_copy(update={"anomaly": "invariant_violation"})
    plan = plan_repairs(incident, root=root, invariants={"corpus_accounts": ["balance >= 0"]})
    assert plan.strategy == ATOMIC_UPDATE
    golden("sqlalchemy.invariant_violation.diff", plan.diff)
    unguarded = plan_repairs(incident, root=root)
    assert "+            .values(balance=Account.balance + amount)\n" in unguarded.diff
    assert ">= 0" not in unguarded.diff
    source = root / "app.py"
    original = source.read_bytes()
    apply(plan, root)
    compile(source.read_bytes(), str(source), "exec")
    revert(plan, root)
    assert source.read_bytes() == original


def test_core_code_gets_the_lock_on_its_select_chain(tmp_path: Path) -> None:
    """SQLAlchemy Core (``Table(...)``, no mapped class): the read in a helper, ``select(...).where(...)``, takes
    ``.with_for_update()``; the statements are SQLAlchemy's own, compiled for PostgreSQL (psycopg)."""
    root = tmp_path / "bank"
    root.mkdir()
    shutil.copy(CORE_BANK, root / "bank.py")
    spec = importlib.util.spec_from_file_location("core_bank_fixture", root / "bank.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dialect = postgresql.psycopg.dialect()  # type: ignore[attr-defined]
    table = module.accounts
    read = str(select(table.c.balance).where(table.c.id == 1).compile(dialect=dialect))
    write = str(update(table).where(table.c.id == 1).values(balance=5).compile(dialect=dialect))

    def access(statement: str, operation: str, trace: str) -> AccessInfo:
        return AccessInfo(trace_id=trace * 32, span_id=trace * 16, service="bank", version="1",
                          function="bank.withdraw", file="bank.py", route="", operation=operation, lock="none",
                          statement=statement, params=[], set_values={}, start_unix_ms=0.0, offset_ms=0.0, error=False,
                          exception="", http_status=200)  # fmt: skip

    accesses = [access(read, "read", "a"), access(read, "read", "b"), access(write, "write", "a"),
                access(write, "write", "b")]  # fmt: skip
    plan = plan_repairs(
        incident("lost_update", "accounts", "accounts:1", accesses[2], accesses[3], accesses), root=root
    )
    assert plan.strategy == ROW_LOCK
    assert "+    return int(conn.execute(select(accounts.c.balance).where(accounts.c.id == account_id)" \
           ".with_for_update()).scalar_one())\n" in plan.diff  # fmt: skip
    assert [e.after for e in plan.edits] == [read + " FOR UPDATE"]


def test_a_reader_takes_share_locks(root: Path) -> None:
    """``FOR SHARE`` (a read skew's reader): the aggregate's subquery and ``session.get`` read with ``read=True``."""
    incident = stack_incident("write_skew", "bug", root)
    reads = tuple(a for a in incident.accesses if a.operation == "read" and a.trace_id == incident.victim.trace_id)
    w = Writer("app.go_off_call", "app.py", root / "app.py", "app.py", (), reads)
    ctx = Context(index=SourceIndex(root))
    outcome = sqlalchemy_orm.STRATEGIES[SHARE_LOCK](ctx, w)
    patch = Patch(ctx.index)
    for op in outcome.ops:
        op(patch)
    [(_, _, after)] = patch.render()
    assert b"Doctor.on_call).with_for_update(read=True).subquery()))\n" in after
    assert b'session.get(Doctor, name, with_for_update={"read": True})\n' in after
    assert [e.after.endswith("FOR SHARE") for e in outcome.edits] == [False, True]  # the count: FOR SHARE inside
    assert "FOR SHARE)" in outcome.edits[0].after
