"""The corpus, closed loop on a real PostgreSQL: the incident the replay reports for each bug scenario's first bug
round, proven by the daemon's repro worker (``tests.corpus.repros``): its repro (application level where the call is
derived from the spans, else SQL level), on a scratch database with the scenario's own tables, fails RED as
production did, step for step; the planner's first strategy, planned from the corpus apps' code, makes the same
incident pass GREEN. A control round, compiled the same way, is not RED.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from processors.model.outputs import ReproEvent
from processors.repro import GeneratedTest, first_divergence, run_repro
from tests.corpus.repros import BUGS, CONTROLS, compile_control, first_bug, prove_all
from tests.repro.cases import Run

pytestmark = pytest.mark.engines

STALE = "stale read took effect, no serial order explains the outcome"
# the level the worker picks with no hand-written call specs: application level where the call is derived from the
# spans (a module-level function under the checkout whose every parameter the request's row values name), else SQL
LEVEL = {"lost_update": "sql", "write_skew": "app", "phantom": "app", "read_skew": "sql", "invariant_violation": "app"}
# What each RED run reports: the production failure, named by the rows and statements of the round.
RED = {
    "lost_update": ["lost update on corpus_accounts:acc-1-bug: balance = 110 committed by session 2 "
                    "(corpus.lost_update.deposit) is gone from the final row (balance = 125); session 1 "
                    "(corpus.lost_update.deposit) overwrote it without reading it"],
    "write_skew": [STALE, "(corpus.write_skew.go_off_call) read [[2]] with `SELECT count(*) FROM corpus_doctors "
                   "WHERE shift = %s AND on_call [1]` where the serial run read [[1]], then `UPDATE corpus_doctors "
                   "SET on_call = false WHERE name = %s` changed 1 row and committed"],
    "phantom": [STALE, "(corpus.phantom.book) read [] with `SELECT booking_id FROM corpus_bookings WHERE room = %s "
                "AND day = %s [101, '2030-01-15']` where the serial run read [[1]], then `INSERT INTO corpus_bookings "
                "(room, day, guest) VALUES (%s, %s, %s) RETURNING booking_id` changed 1 row and committed"],
    "read_skew": [STALE, "session 1 (corpus.read_skew.audit) read [[60]] with `SELECT balance FROM corpus_ledger "
                  "WHERE acct = %s ['b-1']` where the serial run read [[50]], and committed what it read"],
    "invariant_violation": [STALE, "(corpus.invariant_violation.buy) read [[1]] with `SELECT qty FROM corpus_stock "
                            "WHERE item = %s ['item-1']` where the serial run read [[0]], then `UPDATE corpus_stock "
                            "SET qty = qty - 1 WHERE item = %s RETURNING qty` changed 1 row and committed"],
}  # fmt: skip
# The planner's first strategy for each: (function, strategy, statement after, lock before -> after).
REPAIRS = {
    "lost_update": ("corpus.lost_update.deposit", "row_lock",
                    "SELECT balance FROM corpus_accounts WHERE account_no = %s FOR UPDATE", "none", "for_update"),
    "write_skew": ("corpus.write_skew.go_off_call", "row_lock", "SELECT count(*) FROM (SELECT * FROM corpus_doctors "
                   "WHERE shift = %s AND on_call FOR UPDATE) AS corpus_doctors", "none", "for_update"),
    "phantom": ("corpus.phantom.book", "unique_insert", "INSERT INTO corpus_bookings (room, day, guest) VALUES "
                "(%s, %s, %s) ON CONFLICT (room, day) DO NOTHING RETURNING booking_id", "none", "upsert"),
    "read_skew": ("corpus.read_skew.audit", "share_lock", "SELECT balance FROM corpus_ledger WHERE acct = %s FOR SHARE",
                  "none", "for_share"),
    "invariant_violation": ("corpus.invariant_violation.buy", "atomic_update", "UPDATE corpus_stock SET qty = qty - 1 "
                            "WHERE item = %s AND qty >= 1 RETURNING qty", "none", "atomic"),
}  # fmt: skip


Controls = dict[str, tuple[GeneratedTest, Run]]


@pytest.fixture(scope="module")
async def loop(postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, ReproEvent], Controls]:
    """Every bug scenario's first incident through the repro worker (one after the other, see ``prove_all``) while
    the first round of each control kind that compiles, compiled here like a bug incident, runs alongside."""
    root = tmp_path_factory.mktemp("corpus-repros")
    tests = {f"{scenario}/{kind}": compile_control(scenario, kind)[1] for scenario, kind in CONTROLS}
    with ThreadPoolExecutor(max_workers=2) as pool:  # each run is a subprocess with its own scratch database
        runs = {key: pool.submit(run_repro, test, dsn=postgres_dsn,
                                 workdir=root / "controls" / key.replace("/", "-").replace(":", "-"))
                for key, test in tests.items()}  # fmt: skip
        proofs = await prove_all(BUGS, postgres_dsn, root / "bugs")
        controls = {key: (tests[key], run.result()) for key, run in runs.items()}
    return proofs, controls


@pytest.fixture(scope="module")
def proofs(loop: tuple[dict[str, ReproEvent], Controls]) -> dict[str, ReproEvent]:
    return loop[0]


@pytest.fixture(scope="module")
def controls(loop: tuple[dict[str, ReproEvent], Controls]) -> Controls:
    return loop[1]


def test_every_bug_scenario_is_proven() -> None:
    assert BUGS == ["lost_update", "write_skew", "phantom", "read_skew", "invariant_violation"]


@pytest.mark.parametrize("scenario", BUGS)
def test_the_first_bug_round_is_red_as_in_production(proofs: dict[str, ReproEvent], scenario: str) -> None:
    """The repro of the replay's incident (application level where the call is derived from the spans, else SQL
    level) fails with the production failure and does what production did, step for step (the worker's
    first-divergence check)."""
    rnd, incident = first_bug(scenario)
    assert (incident.anomaly, rnd.number) == (scenario, 1)
    event = proofs[scenario]
    assert (event.fingerprint, event.anomaly, event.level) == (incident.fingerprint, scenario, LEVEL[scenario])
    assert event.red.status == "failed", event.red.failure
    for fragment in RED[scenario]:
        assert fragment in event.red.failure
    assert event.divergence.faithful, event.divergence


@pytest.mark.parametrize("scenario", BUGS)
def test_the_planners_first_strategy_makes_it_green(proofs: dict[str, ReproEvent], scenario: str) -> None:
    """One writer (or, for the read skew, the reader) repaired by the first strategy of its class, planned from the
    corpus app's source; the same repro on the patched code (application level) or with the plan's SQL-level form
    passes: proven."""
    event = proofs[scenario]
    assert [(r.function, r.strategy, r.statement_after, r.lock_before, r.lock_after) for r in event.repairs] == [
        REPAIRS[scenario]]  # fmt: skip
    assert event.repairs[0].file == f"bench/corpus/apps/{scenario}.py"
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.proven


@pytest.mark.parametrize("control", [f"{s}/{k}" for s, k in CONTROLS])
def test_a_control_round_is_not_red(controls: Controls, control: str) -> None:
    """A control's two requests, compiled in the class of the scenario's bug, replay faithfully and pass: a lock
    that made the follower wait, a relative or guarded write, a unique constraint, one statement."""
    test, (run, executed) = controls[control]
    assert run.status == "passed", run.failure
    assert first_divergence(test.production_sequence, executed).faithful
