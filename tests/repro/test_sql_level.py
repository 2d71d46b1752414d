"""SQL-level repros of the three shop defects on a real PostgreSQL: RED as in production, faithful, and GREEN once
the statements are in their protected forms (with the lock wait that protects them observed)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import psycopg
import pytest

from bench.shop.repro_specs import SCHEMA_SQL
from processors.repro import GeneratedTest, apply_rewrites, compile_repro, first_divergence, lock_waits, run_repro
from tests.repro.cases import ANOMALIES, PROTECTED, RED_SQL, Run, incident, run_all

pytestmark = pytest.mark.engines

VARIANTS = ("red", "derived", "green")


def _compile(anomaly: str, variant: str) -> GeneratedTest:
    event = incident(anomaly)
    if variant == "green":
        event = apply_rewrites(event, PROTECTED[anomaly])
    return compile_repro(event, schema_sql=None if variant == "derived" else SCHEMA_SQL)


@pytest.fixture(scope="module")
def runs(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GeneratedTest, Run]]:
    """Every SQL-level run of this module, run once, in parallel."""
    tests = {f"{v}:{a}": _compile(a, v) for a in ANOMALIES for v in VARIANTS}
    tests["serializable:lost_update"] = compile_repro(incident("lost_update"), schema_sql=SCHEMA_SQL,
                                                      isolation="serializable")  # fmt: skip
    root = tmp_path_factory.mktemp("sql-level")
    jobs = {k: partial(run_repro, t, dsn=postgres_dsn, workdir=root / k.replace(":", "-")) for k, t in tests.items()}
    done = run_all(jobs)
    return {k: (tests[k], done[k]) for k in tests}


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_red_with_the_shop_schema(runs: dict[str, tuple[GeneratedTest, Run]], anomaly: str) -> None:
    """The replay with the shop's schema fails with the production failure and matches production step for step."""
    test, (run, executed) = runs[f"red:{anomaly}"]
    assert run.status == "failed", run.failure
    assert "DefectReproduced" in run.failure and RED_SQL[anomaly] in run.failure
    assert first_divergence(test.production_sequence, executed).faithful
    assert [s.step for s in executed] == list(range(len(test.production_sequence)))


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_red_with_a_table_derived_from_the_row_images(runs: dict[str, tuple[GeneratedTest, Run]],
                                                      anomaly: str) -> None:  # fmt: skip
    """Without a schema, the table derived from the Debezium images reproduces the same failure, faithfully."""
    test, (run, executed) = runs[f"derived:{anomaly}"]
    assert "SCHEMA_SQL: str | None = None" in test.source
    assert run.status == "failed" and RED_SQL[anomaly] in run.failure
    assert first_divergence(test.production_sequence, executed).faithful


def test_red_oversell_replays_the_victims_wait_for_the_culprits_row_lock(
    runs: dict[str, tuple[GeneratedTest, Run]],
) -> None:
    """In the oversell, the victim's UPDATE starts before the culprit commits, so the replay waits as production did."""
    _, (_, executed) = runs["red:invariant_violation"]
    assert lock_waits(executed) == [
        "session 1 waited on a lock held by session 2: UPDATE inventory SET stock = stock - 1 WHERE sku = %s "
        "RETURNING stock"
    ]


GREEN_WAITS = {
    "lost_update": "session 2 waited on a lock held by session 1: SELECT status, version, amount FROM orders "
    "WHERE id = %s FOR UPDATE",
    "invariant_violation": "session 1 waited on a lock held by session 2: UPDATE inventory SET stock = stock - 1 "
    "WHERE sku = %s AND stock >= 1 RETURNING stock",
    "duplicate_apply": "session 2 waited on a lock held by session 1: INSERT INTO charges (order_id, amount, "
    "idempotency_key) VALUES (%s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
}


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_green_with_protected_statements(runs: dict[str, tuple[GeneratedTest, Run]], anomaly: str) -> None:
    """The same generated test over the protected statements passes, and shows the lock wait that protects them."""
    _, (run, executed) = runs[f"green:{anomaly}"]
    assert run.status == "passed", run.failure
    assert lock_waits(executed) == [GREEN_WAITS[anomaly]]


def test_green_lost_update_stops_the_session_that_read_the_new_row(
    runs: dict[str, tuple[GeneratedTest, Run]],
) -> None:
    """Behind the lock, the expiry job reads the cancelled row, not production's pending one, and writes nothing."""
    test, (_, executed) = runs["green:lost_update"]
    read = next(s for s in executed if s.session == 2)
    assert read.values == ["cancelled", 1, 4200] and read.waited_on == 1
    assert [s.session for s in executed] == [1, 2, 1, 1]
    assert len(test.production_sequence) == 6


def test_green_with_serializable_sessions(runs: dict[str, tuple[GeneratedTest, Run]]) -> None:
    """The recorded statements under SERIALIZABLE: capture's UPDATE fails to serialize, and nothing is lost."""
    _, (run, executed) = runs["serializable:lost_update"]
    assert run.status == "passed", run.failure
    failed = [s for s in executed if s.outcome == "error"]
    assert [(s.session, s.error.split(":")[0]) for s in failed] == [(2, "SerializationFailure")]


def test_runs_leave_no_scratch_database(runs: dict[str, tuple[GeneratedTest, Run]], postgres_dsn: str) -> None:
    """Each run drops the database it created."""
    with psycopg.connect(postgres_dsn) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'repro\\_%'").fetchall()
    assert left == []


def test_a_run_without_a_reachable_server_is_an_error_not_a_verdict(tmp_path: Path) -> None:
    """A repro that cannot reach PostgreSQL reports ``error``: it proves nothing either way."""
    run, executed = run_repro(_compile("lost_update", "red"), dsn="postgresql://nobody@127.0.0.1:9/none",
                              workdir=tmp_path)  # fmt: skip
    assert run.status == "error" and "connection" in run.failure.lower()
    assert executed == []
