"""Repairs of the classes over two rows, and of the invariant violation with no invariant configured: the plans, and
the loop on a real PostgreSQL — each incident (built by the real detector, ``tests/repro/anomalies.py``) RED, its
plan applied, the same incident GREEN, at SQL level (the plan's statement edits, isolation levels and migrations)
and at application level (the recorded functions of a patched copy of the code).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from bench.shop.repro_specs import CALL_SPECS
from bench.shop.repro_specs import SCHEMA_SQL as SHOP_SCHEMA
from processors.connectors.repro.green import sql_green
from processors.repair import RepairPlan, apply, plan_repairs
from processors.repro import CallSpec, Const, GeneratedTest, Param, compile_repro, first_divergence, run_repro
from tests.repair.cases import GOLDEN
from tests.repair.test_repair_shop import golden
from tests.repro.anomalies import (
    AUDIT,
    BOOK,
    CASES,
    CHARGE,
    CLINIC_SCHEMA,
    GO_OFF_CALL,
    READ_BALANCE,
    REPO,
)
from tests.repro.cases import Run, run_all
from tests.repro.cases import incident as captured

SCHEMAS = {"write_skew": CLINIC_SCHEMA, "phantom": SHOP_SCHEMA, "double_booking": CLINIC_SCHEMA,
           "read_skew": CLINIC_SCHEMA, "invariant_violation": SHOP_SCHEMA}  # fmt: skip
LOCKED_COUNT = "SELECT count(*) FROM (SELECT * FROM doctors WHERE shift = %s AND on_call FOR UPDATE) AS doctors"
BOOK_ONCE = "CREATE UNIQUE INDEX IF NOT EXISTS bookings_room_day_key ON bookings(room, day)"
CHARGE_ONCE = "CREATE UNIQUE INDEX IF NOT EXISTS charges_order_id_key ON charges(order_id)"

# How the generated application-level tests call the recorded functions: the shop's own (bench/shop/repro_specs.py:
# its charge takes the INSERT's parameters, the lookup that found nothing is not counted), and the clinic's. A
# booking's guest is counted from the session's last statement on the rows (``Param(-1, 2)``).
SPECS: dict[str, CallSpec] = {
    **CALL_SPECS,
    GO_OFF_CALL: CallSpec("tests.repair.clinic.oncall:go_off_call", (Param(0, 0), Param(1, 0))),
    BOOK: CallSpec("tests.repair.clinic.bookings:book", (Param(0, 0), Param(0, 1), Param(-1, 2))),
    "clinic.ledger.transfer": CallSpec("tests.repair.clinic.ledger:transfer", (Param(0, 1), Param(1, 1),
                                                                                Param(0, 0))),
    AUDIT: CallSpec("tests.repair.clinic.ledger:audit", (Param(0, 0), Param(1, 0), Const(100))),
}  # fmt: skip


def source_copy(root: Path) -> Path:
    """``root`` holding copies of the shop (``bench/shop``) and the clinic (``tests/repair/clinic``)."""
    (root / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "__init__.py", root / "bench" / "__init__.py")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "bench" / "shop", root / "bench" / "shop", ignore=ignore)
    shutil.copytree(REPO / "tests" / "repair" / "clinic", root / "tests" / "repair" / "clinic", ignore=ignore)
    return root


@pytest.fixture
def app(tmp_path: Path) -> Path:
    return source_copy(tmp_path / "app")


def plans(plan: RepairPlan) -> list[RepairPlan]:
    return [plan, *plan.alternatives]


# ---- the plans -------------------------------------------------------------------------------------------------


def test_write_skew_locks_the_rows_its_check_counts(app: Path) -> None:
    """Each check counts the doctors on call through a subquery that locks them; SERIALIZABLE is the alternative."""
    plan = plan_repairs(CASES["write_skew"](app), root=app)
    assert [(r.function, r.strategy, r.statement_after) for r in plan.repairs] == [
        (GO_OFF_CALL, "row_lock", LOCKED_COUNT)]  # fmt: skip
    assert [(e.before, e.after) for e in plan.edits] == [(plan.repairs[0].statement_before, LOCKED_COUNT)]
    [serializable] = plan.alternatives
    assert (serializable.strategy, serializable.isolation) == ("stricter_isolation", {GO_OFF_CALL: "serializable"})
    golden("write_skew.diff", plan.diff)
    golden("write_skew.stricter_isolation.diff", serializable.diff)


def test_write_skew_over_a_row_the_check_did_not_select_runs_serializable(app: Path) -> None:
    """A lock covers only the rows the check selects: when the other request changed a row that was not among them
    (it entered the predicate), FOR UPDATE cannot prevent the skew, and the plan says so."""
    event = CASES["write_skew"](app)
    entered = event.commits[1].model_copy(update={"before": {"name": "bob", "shift": 1, "on_call": False}})
    plan = plan_repairs(event.model_copy(update={"commits": [event.commits[0], entered]}), root=app)
    assert [r.strategy for r in plan.repairs] == ["stricter_isolation"] and not plan.alternatives
    assert any("row_lock does not apply: lsn 102 changed a row the other request's read did not select" in n
               for n in plan.notes)  # fmt: skip


@pytest.mark.parametrize("source", ["built", "captured"])
def test_the_shops_double_charge_as_a_phantom_plans_the_idempotency_key(tmp_path: Path, source: str) -> None:
    """The shop's double charge, reported as a phantom (built by the detector here, or as the live pipeline
    published it), gets the idempotency-key repair the duplicate apply got, the way ``make demo`` plans it
    (bench/demo.py ``deploy_patched``: paths recorded in this checkout, mapped onto a copy, the three fingerprints'
    plans applied in turn)."""
    copy = source_copy(tmp_path / "shop-1.1.0")
    phantom = CASES["phantom"](REPO) if source == "built" else captured("phantom")
    kwargs = {"invariants": {"inventory": ["stock >= 0"]}, "source_map": {str(REPO): copy}}
    plan = plan_repairs(phantom, root=copy, **kwargs)  # type: ignore[arg-type]
    assert [(r.function, r.strategy, r.lock_before, r.lock_after) for r in plan.repairs] == [
        (CHARGE, "idempotency_guard", "none", "upsert")]  # fmt: skip
    assert plan.diff == (GOLDEN / "duplicate_apply.diff").read_text()  # one helper, the same edit
    assert [a.strategy for a in plan.alternatives] == ["unique_insert", "stricter_isolation"]
    assert plan.alternatives[0].migrations == [CHARGE_ONCE]
    golden("phantom.unique_insert.diff", plan.alternatives[0].diff)
    for event in (captured("lost_update"), captured("invariant_violation"), phantom):
        recorded = str(Path(event.culprit.file).parents[2])
        each = plan_repairs(event, root=copy, invariants={"inventory": ["stock >= 0"]}, source_map={recorded: copy})
        assert each.repairs, each.notes
        apply(each, copy)
    patched = (copy / "bench" / "shop" / "handlers.py").read_text()
    assert "ON CONFLICT (idempotency_key) DO NOTHING" in patched and "AND stock >= 1" in patched
    compile(patched, "handlers.py", "exec")


def test_double_booking_gets_a_unique_index_and_keeps_its_own_answer(app: Path) -> None:
    """Without an idempotency key, the rows the lookup pins (room, day) get a unique index (the migration the plan
    carries) and the INSERT conflicts on it; a refused booking answers like the lookup's "taken" branch."""
    plan = plan_repairs(CASES["double_booking"](app), root=app)
    assert [(r.function, r.strategy, r.lock_after) for r in plan.repairs] == [(BOOK, "unique_insert", "upsert")]
    assert plan.migrations == [BOOK_ONCE]
    assert "        if row is None:\n            return -1\n" in plan.diff.replace("+", "")
    assert any("idempotency_guard does not apply: no idempotency key in scope of book()" in n for n in plan.notes)
    golden("phantom.double_booking.diff", plan.diff)


def test_read_skew_locks_what_the_reader_read_first(app: Path) -> None:
    """The audit's balance reads take FOR SHARE (a transfer then waits for the audit); REPEATABLE READ, one snapshot
    for the audit, is the alternative. The transfer itself is left alone."""
    plan = plan_repairs(CASES["read_skew"](app), root=app)
    assert [(r.function, r.strategy, r.lock_before, r.lock_after, r.statement_after) for r in plan.repairs] == [
        (AUDIT, "share_lock", "none", "for_share", READ_BALANCE + " FOR SHARE")]  # fmt: skip
    [snapshot] = plan.alternatives
    assert snapshot.isolation == {AUDIT: "repeatable_read"}
    assert 'cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")' in snapshot.diff
    golden("read_skew.diff", plan.diff)
    golden("read_skew.repeatable_read.diff", snapshot.diff)


def test_the_sql_level_form_of_each_plan(app: Path) -> None:
    """What a SQL-level repro replays for GREEN: the edits with their new parameters, migrations, isolation levels;
    none for an edit that binds a value the recording does not carry (the request's idempotency key)."""
    forms = {}
    for case, build in CASES.items():
        event = build(app)
        for p in plans(plan_repairs(event, root=app)):
            green = sql_green(event, p)
            forms[f"{case}/{p.strategy}"] = None if green is None else {
                "statements": sorted({a.statement for a in green.incident.accesses}),
                "isolation": green.session_isolation, "migrations": green.migrations}  # fmt: skip
    assert forms["phantom/idempotency_guard"] is None
    golden("anomaly_sql_forms.json", json.dumps(forms, indent=2, sort_keys=True) + "\n")


# ---- RED, repaired, GREEN on the real PostgreSQL -----------------------------------------------------------------

Job = Callable[[], Run]


@pytest.fixture(scope="module")
def loop(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GeneratedTest, Run]]:
    """For every case: the SQL-level RED, the SQL-level GREEN of its plan and of each alternative that has a SQL
    form; the application-level RED, and GREEN against a copy patched with the plan (and with each alternative
    that carries a migration or an isolation level). Run once, in parallel."""
    base = tmp_path_factory.mktemp("anomaly-repairs")
    root = source_copy(base / "recorded")
    tests: dict[str, tuple[GeneratedTest, str | None]] = {}
    for case, build in CASES.items():
        event, schema = build(root), SCHEMAS[case]
        tests[f"sql-red/{case}"] = (compile_repro(event, schema_sql=schema), None)
        tests[f"app-red/{case}"] = (compile_repro(event, level="app", schema_sql=schema, call_specs=SPECS), None)
        plan = plan_repairs(event, root=root)
        for p in plans(plan):
            green = sql_green(event, p)
            if green is not None:
                tests[f"sql-green/{case}/{p.strategy}"] = (compile_repro(
                    green.incident, schema_sql=schema, session_isolation=green.session_isolation,
                    migrations=green.migrations), None)  # fmt: skip
            if p is plan or p.migrations or p.isolation:
                patched = source_copy(base / f"{case}-{p.strategy}")
                apply(p, patched)
                test = compile_repro(event, level="app", schema_sql=schema, call_specs=SPECS, migrations=p.migrations)
                tests[f"app-green/{case}/{p.strategy}"] = (test, str(patched))
    runs = base / "runs"
    jobs: dict[str, Job] = {
        key: partial(run_repro, test, dsn=postgres_dsn, workdir=runs / key.replace("/", "-"), source_root=source)
        for key, (test, source) in tests.items()
    }
    done = run_all(jobs)
    return {key: (tests[key][0], done[key]) for key in tests}


def _keys(loop: dict[str, tuple[GeneratedTest, Run]], prefix: str) -> list[str]:
    return sorted(k for k in loop if k.startswith(prefix))


@pytest.mark.engines
@pytest.mark.parametrize("level", ["sql", "app"])
@pytest.mark.parametrize("case", list(CASES))
def test_red_before_the_repair(loop: dict[str, tuple[GeneratedTest, Run]], case: str, level: str) -> None:
    """Unrepaired, the repro fails as production did, faithfully: the stale read took effect (and at application
    level, the victim's request fails as it did, where it failed)."""
    test, (run, executed) = loop[f"{level}-red/{case}"]
    assert run.status == "failed", run.failure
    assert "stale read took effect" in run.failure
    assert first_divergence(test.production_sequence, executed).faithful
    failed = {"phantom": "IdempotencyKeyReused", "read_skew": "BooksDoNotBalance", "invariant_violation": "Oversold"}
    if level == "app" and case in failed:
        assert f"failed as in production: {failed[case]}" in run.failure


@pytest.mark.engines
def test_green_after_every_repair(loop: dict[str, tuple[GeneratedTest, Run]]) -> None:
    """The same incident passes after each plan: SQL level for every plan with a SQL form, application level
    against the patched code (the phantom's idempotency key only there: the key is not in the recording)."""
    greens = _keys(loop, "sql-green/") + _keys(loop, "app-green/")
    assert set(greens) >= {
        "sql-green/write_skew/row_lock", "sql-green/write_skew/stricter_isolation",
        "sql-green/phantom/unique_insert", "sql-green/phantom/stricter_isolation",
        "sql-green/double_booking/unique_insert", "sql-green/double_booking/stricter_isolation",
        "sql-green/read_skew/share_lock", "sql-green/read_skew/repeatable_read",
        "sql-green/invariant_violation/atomic_update", "sql-green/invariant_violation/row_lock",
        "sql-green/invariant_violation/stricter_isolation",
        "app-green/write_skew/row_lock", "app-green/phantom/idempotency_guard", "app-green/phantom/unique_insert",
        "app-green/double_booking/unique_insert", "app-green/read_skew/share_lock",
        "app-green/read_skew/repeatable_read", "app-green/invariant_violation/atomic_update",
    }  # fmt: skip
    failing = {k: loop[k][1][0].failure[:300] for k in greens if loop[k][1][0].status != "passed"}
    assert failing == {}


@pytest.mark.engines
def test_green_shows_how_the_repair_protects(loop: dict[str, tuple[GeneratedTest, Run]]) -> None:
    """At application level, the second doctor's locked count waits for the first and finds one on call (it stays
    on call); the retried charge inserts nothing and answers with the first charge; the audit's FOR SHARE makes
    the transfer wait for it."""
    _, (_, executed) = loop["app-green/write_skew/row_lock"]
    counts = [(s.session, s.waited_on, s.values) for s in executed if s.statement.startswith("SELECT count(*)")]
    assert counts == [(1, None, [2]), (2, 1, [1])]
    assert [s.session for s in executed if s.statement.startswith("UPDATE doctors")] == [1]
    _, (_, executed) = loop["app-green/phantom/idempotency_guard"]
    assert [(s.session, s.rows) for s in executed if s.statement.startswith("INSERT INTO charges")] == [(1, 1), (2, 0)]
    _, (_, executed) = loop["app-green/read_skew/share_lock"]
    assert [(s.session, s.waited_on) for s in executed if s.waited_on is not None] == [(2, 1)]
