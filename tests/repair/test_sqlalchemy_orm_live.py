"""The SQLAlchemy repairs really fix the flask_sqlalchemy stack: RED with its own code, GREEN with the patched copy.

For each collision class, the stack's bug round (``bench.corpus``'s duel: the interleaving forced at the views' race
points) runs twice against real PostgreSQL (READ COMMITTED), on fresh rows: with the stack's own module, where the
damage shows (a deposit lost, no doctor left on call, the room booked twice), then with a copy of ``app.py`` that
the planner patched (its schema migration applied first), imported under a module name of its own, where the damage
is gone. A row lock taken before the race point keeps the other request from reaching it: its barrier then waits
for its timeout, so these rounds run with a short one. The statements the stack ran are also checked to be the
recorded ones the unit tests use (``fixtures/flask_sqlalchemy_statements.json``).
"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event

from bench.corpus import race
from bench.corpus.apps.lost_update import AMOUNTS, OPENING
from bench.corpus.runner import drop_schema, prepare, untraced
from bench.corpus.scenario import BUG, RoundPlan, Scenario
from bench.corpus.stacks.flask_sqlalchemy import app as stack
from bench.corpus.stacks.web import STACK_SCENARIOS, restack
from processors.repair import apply, plan_repairs
from processors.repair.planner import RepairPlan
from processors.repair.strategies import ATOMIC_UPDATE, OPTIMISTIC_VERSION, ROW_LOCK, STRICTER_ISOLATION, UNIQUE_INSERT
from tests.repair.sqla_cases import recorded, stack_copy, stack_incident

pytestmark = pytest.mark.engines

SCENARIOS = {s.name: s for s in STACK_SCENARIOS}
# (class, strategy, what the patched code must send to PostgreSQL, the two answers' statuses in order): the
# primaries, and alternatives as offered. Both deposits land under a lock; one of two doctors (bookings) is refused,
# whichever waited; a versioned deposit that lost the race fails at its flush (StaleDataError: 500), losing nothing.
CASES = [
    ("lost_update", ROW_LOCK, "FOR UPDATE", [200, 200]),
    ("write_skew", ROW_LOCK, "FOR UPDATE", [200, 409]),
    ("phantom", UNIQUE_INSERT, "ON CONFLICT", [200, 409]),
    ("write_skew", STRICTER_ISOLATION, "", [200, 409]),
    ("lost_update", OPTIMISTIC_VERSION, "AND corpus_accounts.version = ", [200, 500]),
    ("lost_update", ATOMIC_UPDATE, "SET balance=(corpus_accounts.balance + ", [200, 200]),
]
# The atomic update is what an invariant violation gets first: the deposit planned as one (balance >= 0), which
# the guarded UPDATE keeps, and which a lost deposit would not break.
PLANNED_AS = {ATOMIC_UPDATE: "invariant_violation"}
INVARIANTS = {"corpus_accounts": ["balance >= 0"]}


def damage(conn: psycopg.Connection, anomaly: str, plan: RoundPlan, statuses: tuple[int, int]) -> str:
    """The round's damage as PostgreSQL shows it ("" when none)."""
    if anomaly == "lost_update":  # every deposit answered 200 is in the balance
        row = conn.execute("SELECT balance FROM corpus_accounts WHERE account_no = %s", (plan.leader.args[0],))
        balance = row.fetchone()
        want = OPENING + sum(a for a, status in zip(AMOUNTS, statuses, strict=True) if status == 200)
        return "" if balance is not None and balance[0] == want else f"balance {balance}, deposits made {want}"
    if anomaly == "write_skew":
        shift = plan.leader.args[1]
        count = conn.execute("SELECT count(*) FROM corpus_doctors WHERE shift = %s AND on_call", (shift,)).fetchone()
        return "" if count is not None and count[0] >= 1 else f"nobody on call in shift {shift}"
    room, day = plan.leader.args[0], plan.leader.args[1]
    found = conn.execute("SELECT count(*) FROM corpus_bookings WHERE room = %s AND day = %s", (room, day)).fetchone()
    return "" if found is not None and found[0] <= 1 else f"room {room} booked {found} times on {day}"


def play(module: ModuleType, engine: Engine, plan: RoundPlan) -> tuple[int, int]:
    """The round's duel against ``module``'s views (its own Flask app): the two answers' statuses."""
    app = module.create_app(engine)

    def request(path: str, args: tuple[Any, ...]) -> Any:
        return lambda: app.test_client().post(path, json={"args": list(args)}).status_code

    leader, follower, _ = race.duel(request(plan.leader.path, plan.leader.args),
                                    request(plan.follower.path, plan.follower.args), plan.choreography)  # fmt: skip
    return leader, follower


def load(path: Path) -> ModuleType:
    """The patched ``app.py`` as a module of its own (the stack's module stays as it is)."""
    name = f"flask_sqlalchemy_repaired_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def chosen(plan: RepairPlan, strategy: str) -> RepairPlan:
    return plan if plan.strategy == strategy else next(a for a in plan.alternatives if a.strategy == strategy)


@pytest.fixture
def schema(postgres_dsn: str) -> Iterator[str]:
    name = f"sqla_repair_{uuid.uuid4().hex[:8]}"
    yield name
    drop_schema(postgres_dsn, name)


@pytest.mark.parametrize(("anomaly", "strategy", "sent", "answers"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_patched_stack_no_longer_shows_the_damage(postgres_dsn: str, schema: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, anomaly: str, strategy: str,
                                                     sent: str, answers: list[int]) -> None:  # fmt: skip
    monkeypatch.setattr(race, "TIMEOUT_S", 1.0)
    scenario: Scenario = SCENARIOS[anomaly]
    view = stack.VIEWS[anomaly][BUG]
    red, green = (restack(scenario.plan(BUG, n), view) for n in (901, 902))
    prepare(postgres_dsn, [(scenario, [red, green])], schema=schema)
    url = postgres_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, connect_args={"options": f"-c search_path={schema}"}, pool_size=4)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    try:
        assert play(stack, engine, red) == (200, 200)
        with untraced(postgres_dsn, schema) as conn:
            assert damage(conn, anomaly, red, (200, 200)), "RED: the stack's own code shows no damage"
        assert set(statements) == set(recorded()[f"{anomaly}/{BUG}"]["statements"])  # type: ignore[arg-type]

        root = stack_copy(tmp_path)
        incident = stack_incident(anomaly, BUG, root)
        incident = incident.model_copy(update={"anomaly": PLANNED_AS.get(strategy, anomaly)})
        plan = chosen(plan_repairs(incident, root=root, invariants=INVARIANTS), strategy)
        apply(plan, root)
        with untraced(postgres_dsn, schema) as conn:
            if anomaly == "phantom":  # the RED round's duplicates are merged first, as the plan's note says
                conn.execute("DELETE FROM corpus_bookings WHERE room = %s", (red.leader.args[0],))
            for migration in plan.migrations:
                conn.execute(migration)  # type: ignore[arg-type]  # the plan's own DDL
        statements.clear()
        statuses = play(load(root / "app.py"), engine, green)
        with untraced(postgres_dsn, schema) as conn:
            assert damage(conn, anomaly, green, statuses) == "", (statuses, plan.diff)
        assert sorted(statuses) == answers, statuses
        assert not sent or any(sent in s for s in statements), statements
    finally:
        engine.dispose()
