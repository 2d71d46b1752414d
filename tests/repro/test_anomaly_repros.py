"""SQL-level repros of the classes over two rows (write skew, phantom, read skew) and of the invariant violation with
no invariant configured, on a real PostgreSQL.

Each incident is built by the real detector from real SQL (``tests/repro/anomalies.py``). Its repro is RED by the
stale-read verdict (no serial order of the two sessions explains what took effect), faithful to production step
for step, with the shop's or the clinic's schema and with a table derived from the row images; it is GREEN under
each protection that prevents the anomaly (a lock, a guard, a unique index, an isolation level), and stays RED
under one that does not.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import psycopg
import pytest

from bench.shop.repro_specs import SCHEMA_SQL as SHOP_SCHEMA
from processors.repro import GeneratedTest, SqlRewrite, apply_rewrites, compile_repro, first_divergence, run_repro
from tests.repair.test_repair_anomalies import SPECS
from tests.repro.anomalies import (
    CASES,
    CLINIC_SCHEMA,
    COUNT_ON_CALL,
    FIND_BOOKING,
    FIND_CHARGE,
    INSERT_BOOKING,
    INSERT_CHARGE,
    READ_BALANCE,
    READ_STOCK,
    TAKE_UNIT,
)
from tests.repro.cases import Run, incident, patched_shop, run_all

pytestmark = pytest.mark.engines

SCHEMAS = {"write_skew": CLINIC_SCHEMA, "phantom": SHOP_SCHEMA, "double_booking": CLINIC_SCHEMA,
           "read_skew": CLINIC_SCHEMA, "invariant_violation": SHOP_SCHEMA}  # fmt: skip

# The verdict against the serial order session 1 then session 2: the stale read, and how it took effect.
RED = {
    "write_skew": "session 2 (clinic.oncall.go_off_call) read [[2]] with `SELECT count(*) FROM doctors WHERE shift = "
    "%s AND on_call [1]` where the serial run read [[1]], then `UPDATE doctors SET on_call = false WHERE name = %s` "
    "changed 1 row and committed",
    "phantom": "session 2 (shop.handlers.charge) read [] with `SELECT id FROM charges WHERE order_id = %s [1009]` "
    "where the serial run read [[1]], then `INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id` "
    "changed 1 row and committed",
    "double_booking": "session 2 (clinic.bookings.book) read [] with `SELECT id FROM bookings WHERE room = %s AND "
    "day = %s [5, '2026-12-01']` where the serial run read [[1]], then `INSERT INTO bookings (room, day, guest) "
    "VALUES (%s, %s, %s) RETURNING id` changed 1 row and committed",
    "read_skew": "session 1 (clinic.ledger.audit) read [[60]] with `SELECT balance FROM ledger WHERE acct = %s "
    "['b']` where the serial run read [[50]], and committed what it read",
    "invariant_violation": "session 2 (shop.handlers.checkout) read [[1]] with `SELECT stock FROM inventory WHERE "
    "sku = %s ['sku-1']` where the serial run read [[0]], then `UPDATE inventory SET stock = stock - 1 WHERE sku = "
    "%s RETURNING stock` changed 1 row and committed",
}


def _for(statement: str, lock: str = "FOR UPDATE") -> SqlRewrite:
    return SqlRewrite(statement, f"{statement} {lock}")


LOCKED_COUNT = "SELECT count(*) FROM (SELECT * FROM doctors WHERE shift = %s AND on_call FOR UPDATE) AS doctors"
CHARGE_ONCE = "CREATE UNIQUE INDEX charges_order_id_key ON charges (order_id)"
BOOK_ONCE = "CREATE UNIQUE INDEX bookings_room_day_key ON bookings (room, day)"
SERIALIZABLE: dict[str, Any] = {"isolation": "serializable"}

# Protections written by hand (the repair planner's are in tests/repair): statement rewrites and compile options.
PROTECTED: dict[str, tuple[str, list[SqlRewrite], dict[str, Any]]] = {
    "write_skew/locked_count": ("write_skew", [SqlRewrite(COUNT_ON_CALL, LOCKED_COUNT)], {}),
    "write_skew/serializable": ("write_skew", [], SERIALIZABLE),
    "phantom/unique": ("phantom", [SqlRewrite(INSERT_CHARGE, INSERT_CHARGE.replace(
        " RETURNING", " ON CONFLICT (order_id) DO NOTHING RETURNING"))], {"migrations": [CHARGE_ONCE]}),
    "phantom/serializable": ("phantom", [], SERIALIZABLE),
    "double_booking/unique": ("double_booking", [SqlRewrite(INSERT_BOOKING, INSERT_BOOKING.replace(
        " RETURNING", " ON CONFLICT (room, day) DO NOTHING RETURNING"))], {"migrations": [BOOK_ONCE]}),
    "read_skew/for_share": ("read_skew", [_for(READ_BALANCE, "FOR SHARE")], {}),
    "read_skew/repeatable_read": ("read_skew", [], {"session_isolation": {"clinic.ledger.audit": "repeatable_read"}}),
    "invariant_violation/atomic": ("invariant_violation", [SqlRewrite(TAKE_UNIT, TAKE_UNIT.replace(
        " RETURNING", " AND stock >= 1 RETURNING"))], {}),
    "invariant_violation/for_update": ("invariant_violation", [_for(READ_STOCK)], {}),
    "invariant_violation/serializable": ("invariant_violation", [], SERIALIZABLE),
}  # fmt: skip

# Protections that do not protect: the repro must stay RED under them.
NOT_PROTECTING: dict[str, tuple[str, list[SqlRewrite], dict[str, Any]]] = {
    "phantom/lock_nothing": ("phantom", [_for(FIND_CHARGE)], {}),  # no row to lock: the insert is a phantom
    "double_booking/lock_nothing": ("double_booking", [_for(FIND_BOOKING)], {}),
    "write_skew/repeatable_read": ("write_skew", [], {"isolation": "repeatable_read"}),  # snapshots allow skew
}


def _compile(case: str, rewrites: list[SqlRewrite], schema: bool = True, **options: Any) -> GeneratedTest:
    event = apply_rewrites(CASES[case](), rewrites)
    return compile_repro(event, schema_sql=SCHEMAS[case] if schema else None, **options)


CAPTURED_UNIQUE = PROTECTED["phantom/unique"][1:]  # the same protection, on the phantom the pipeline captured


@pytest.fixture(scope="module")
def runs(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GeneratedTest, Run]]:
    """Every run of this module, once, in parallel."""
    tests = {f"red/{c}": _compile(c, []) for c in CASES}
    tests |= {f"derived/{c}": _compile(c, [], schema=False) for c in CASES}
    tests |= {k: _compile(c, rw, **options) for k, (c, rw, options) in {**PROTECTED, **NOT_PROTECTING}.items()}
    captured = incident("phantom")
    tests["captured/red"] = compile_repro(captured, schema_sql=SHOP_SCHEMA)
    tests["captured/derived"] = compile_repro(captured)
    tests["captured/unique"] = compile_repro(apply_rewrites(captured, CAPTURED_UNIQUE[0]), schema_sql=SHOP_SCHEMA,
                                             **CAPTURED_UNIQUE[1])  # fmt: skip
    tests["captured/app"] = compile_repro(captured, level="app", schema_sql=SHOP_SCHEMA, call_specs=SPECS)
    root = tmp_path_factory.mktemp("anomaly-repros")
    jobs = {k: partial(run_repro, t, dsn=postgres_dsn, workdir=root / k.replace("/", "-")) for k, t in tests.items()}
    clean = str(patched_shop(root / "clean-shop", "duplicate_apply"))  # the charge's own idempotent path
    jobs["captured/app-green"] = partial(run_repro, tests["captured/app"], dsn=postgres_dsn,
                                         workdir=root / "captured-app-green", source_root=clean)  # fmt: skip
    done = run_all(jobs)
    return {k: (tests[k.removesuffix("-green")], done[k]) for k in done}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("variant", ["red", "derived"])
def test_red_is_the_stale_read_that_took_effect(runs: dict[str, tuple[GeneratedTest, Run]], case: str,
                                                variant: str) -> None:  # fmt: skip
    """With the schema or a table derived from the row images, the replay fails with the stale read that took
    effect, and it did what production did, step for step."""
    test, (run, executed) = runs[f"{variant}/{case}"]
    assert run.status == "failed", run.failure
    assert "DefectReproduced: stale read took effect, no serial order explains the outcome" in run.failure
    assert RED[case] in run.failure
    assert first_divergence(test.production_sequence, executed).faithful
    assert [s.step for s in executed] == list(range(len(test.production_sequence)))


def test_red_explains_both_serial_orders(runs: dict[str, tuple[GeneratedTest, Run]]) -> None:
    """Against each serial order, a session read what that order would not have shown it, and acted on it."""
    _, (run, _) = runs["red/write_skew"]
    assert "against the serial order session 1 then session 2: session 2" in run.failure
    assert (
        " | against the serial order session 2 then session 1: session 1 (clinic.oncall.go_off_call) read [[2]]"
    ) in run.failure
    _, (run, _) = runs["red/read_skew"]  # the audit: one balance from before the transfer, one from after
    assert (
        "against the serial order session 2 then session 1: session 1 (clinic.ledger.audit) read [[50]] with "
        "`SELECT balance FROM ledger WHERE acct = %s ['a']` where the serial run read [[40]]"
    ) in run.failure


@pytest.mark.parametrize("protection", list(PROTECTED))
def test_green_under_each_protection(runs: dict[str, tuple[GeneratedTest, Run]], protection: str) -> None:
    """Each protection makes the same incident GREEN: the stale session waits and reads the serial result, its write
    changes nothing, or it fails to commit."""
    _, (run, executed) = runs[protection]
    assert run.status == "passed", run.failure
    stale_committed = [s for s in executed if s.statement == "COMMIT" and s.outcome == "ok"]
    assert len(stale_committed) <= 2


def test_how_each_protection_protects(runs: dict[str, tuple[GeneratedTest, Run]]) -> None:
    """The lock makes the second check wait and count one; the unique index makes the second insert insert
    nothing; SERIALIZABLE refuses the second commit; REPEATABLE READ gives the audit one snapshot."""
    _, (_, executed) = runs["write_skew/locked_count"]
    second = next(s for s in executed if s.session == 2 and s.statement == LOCKED_COUNT)
    assert second.waited_on == 1 and second.values == [1]
    _, (_, executed) = runs["phantom/unique"]
    assert [(s.session, s.rows) for s in executed if s.statement.startswith("INSERT")] == [(1, 1), (2, 0)]
    _, (_, executed) = runs["write_skew/serializable"]
    assert [(s.session, s.error.split(":")[0]) for s in executed if s.outcome == "error"] == [
        (2, "SerializationFailure")]  # fmt: skip
    _, (_, executed) = runs["read_skew/repeatable_read"]
    assert [s.values for s in executed if s.session == 1 and s.statement == READ_BALANCE] == [[50], [50]]


@pytest.mark.parametrize("protection", list(NOT_PROTECTING))
def test_a_protection_that_does_not_protect_stays_red(runs: dict[str, tuple[GeneratedTest, Run]],
                                                      protection: str) -> None:  # fmt: skip
    """FOR UPDATE on a lookup that finds nothing locks nothing; REPEATABLE READ lets both snapshots skew: RED."""
    _, (run, _) = runs[protection]
    assert run.status == "failed" and "stale read took effect" in run.failure, run.failure


@pytest.mark.parametrize("variant", ["red", "derived", "app"])
def test_the_captured_double_charge_is_red(runs: dict[str, tuple[GeneratedTest, Run]], variant: str) -> None:
    """The shop's double charge as the live pipeline reported it (a phantom, commits credited by a tie): RED at SQL
    level with the schema or a derived table, and at application level (the provider refuses the second charge),
    faithfully."""
    test, (run, executed) = runs[f"captured/{variant}"]
    assert run.status == "failed" and "stale read took effect" in run.failure, run.failure
    assert "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id` changed 1 row and committed" in (
        run.failure)  # fmt: skip
    if variant == "app":
        assert "failed as in production: IdempotencyKeyReused" in run.failure
    assert first_divergence(test.production_sequence, executed).faithful


@pytest.mark.parametrize("variant", ["unique", "app-green"])
def test_the_captured_double_charge_is_green_when_protected(runs: dict[str, tuple[GeneratedTest, Run]],
                                                            variant: str) -> None:  # fmt: skip
    """A unique index with ON CONFLICT (SQL level), or the charge's own idempotent path (application level)."""
    _, (run, _) = runs[f"captured/{variant}"]
    assert run.status == "passed", run.failure


def test_runs_leave_no_scratch_database(runs: dict[str, tuple[GeneratedTest, Run]], postgres_dsn: str) -> None:
    """Every run, serial ones included, drops the databases it created."""
    with psycopg.connect(postgres_dsn) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'repro\\_%'").fetchall()
    assert left == []
