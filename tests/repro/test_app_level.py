"""Application-level repros: the shop's real handlers, called in two threads and paused at the database boundary
in the recorded order; RED against the shop as it is, GREEN against a copy with the protections patched in."""

from __future__ import annotations

from functools import partial

import pytest

from bench.shop.repro_specs import CALL_SPECS, SCHEMA_SQL
from processors.repro import GeneratedTest, compile_repro, first_divergence, lock_waits, run_repro
from tests.repro.cases import ANOMALIES, RED_APP, RED_SQL, REPO, Run, incident, patched_shop, run_all

pytestmark = pytest.mark.engines


def _compile(anomaly: str) -> GeneratedTest:
    return compile_repro(incident(anomaly), level="app", schema_sql=SCHEMA_SQL, call_specs=CALL_SPECS)


@pytest.fixture(scope="module")
def runs(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[GeneratedTest, Run]]:
    """RED (the shop as recorded) and GREEN (a patched copy) of every defect, run once, in parallel."""
    tests = {a: _compile(a) for a in ANOMALIES}
    root = tmp_path_factory.mktemp("app-level")
    jobs = {}
    for a, test in tests.items():
        jobs[f"red:{a}"] = partial(run_repro, test, dsn=postgres_dsn, workdir=root / f"red-{a}")
        source = str(patched_shop(root / f"src-{a}", a))
        jobs[f"green:{a}"] = partial(run_repro, test, dsn=postgres_dsn, workdir=root / f"green-{a}", source_root=source)
    done = run_all(jobs)
    return {k: (tests[k.partition(":")[2]], run) for k, run in done.items()}


def test_the_generated_test_calls_the_recorded_handlers_from_the_recorded_source() -> None:
    """The test imports the shop's functions from where they were recorded, with arguments taken from the params."""
    test = _compile("lost_update")
    assert test.source_root == str(REPO)
    assert "'target': 'bench.shop.jobs:expire_cart', 'args': [1000], 'kwargs': {'clean': False}" in test.source
    assert "'target': 'bench.shop.handlers:capture_payment', 'args': [1000, 'cap-1000']" in test.source
    assert "import bench" not in test.source and "trace_repro" not in test.source


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_red_against_the_shop(runs: dict[str, tuple[GeneratedTest, Run]], anomaly: str) -> None:
    """Unpatched, the handlers fail as in production, the database shows the damage, and the run is faithful."""
    test, (run, executed) = runs[f"red:{anomaly}"]
    assert run.status == "failed", run.failure
    assert "failed as in production" in run.failure
    assert RED_APP[anomaly] in run.failure and RED_SQL[anomaly] in run.failure
    assert first_divergence(test.production_sequence, executed).faithful


def test_red_runs_the_handlers_own_statements_between_the_recorded_ones(
    runs: dict[str, tuple[GeneratedTest, Run]],
) -> None:
    """Statements off the entity (capture's charge) run inside the session's turn, not on the schedule."""
    _, (_, executed) = runs["red:lost_update"]
    off = [s.statement for s in executed if s.step is None]
    assert off == ["SELECT id FROM charges WHERE order_id = %s",
                   "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id"]  # fmt: skip


GREEN_WAITERS = {"lost_update": (2, 1), "invariant_violation": (1, 2), "duplicate_apply": (2, 1)}


@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_green_against_a_patched_copy(runs: dict[str, tuple[GeneratedTest, Run]], anomaly: str) -> None:
    """The same generated test, pointed at a copy of the shop with the protection patched in, passes."""
    _, (run, executed) = runs[f"green:{anomaly}"]
    assert run.status == "passed", run.failure
    waiter, holder = GREEN_WAITERS[anomaly]
    waits = lock_waits(executed)
    assert len(waits) == 1 and waits[0].startswith(f"session {waiter} waited on a lock held by session {holder}")
