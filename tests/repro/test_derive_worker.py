"""The repro worker as ``make demo`` runs it now, with no call specs: each of the sample shop's incidents is proven
at application level with the call specs derived from the spans and the shop's source (RED, faithful, GREEN against
the repaired copy), on the real PostgreSQL; and the derived calls of a method and a coroutine function, RED."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.model.outputs import IncidentEvent, ReproEvent
from processors.repro import CallSpec, Param, compile_repro, first_divergence, run_repro
from processors.repro.derive import derive_call_specs
from tests.repair.test_repair_anomalies import source_copy
from tests.repro.cases import REPO, incident
from tests.repro.test_repro_worker import Worker

pytestmark = pytest.mark.engines

# The request's idempotency key on each statement, as the shop records it (bench/shop/telemetry.RequestBaggage); the
# golden incidents were captured before it did. expire_cart is a job: no request, no key.
KEYS = {"lost_update": {"shop.handlers.capture_payment": "cap-1000"},
        "duplicate_apply": {"shop.handlers.charge": "pay-1009"}, "invariant_violation": {}}  # fmt: skip
STRATEGY = {"lost_update": "row_lock", "invariant_violation": "atomic_update", "duplicate_apply": "idempotency_guard"}
VICTIM = {"lost_update": "OrderChangedConcurrently", "invariant_violation": "Oversold",
          "duplicate_apply": "IdempotencyKeyReused"}  # fmt: skip


def keyed(event: IncidentEvent, keys: dict[str, str]) -> IncidentEvent:
    accesses = [a.model_copy(update={"idempotency_key": keys.get(a.function, "")}) for a in event.accesses]
    return event.model_copy(update={"accesses": accesses})


@pytest.mark.parametrize("anomaly", list(KEYS))
async def test_the_shops_incidents_are_proven_with_derived_call_specs(postgres_dsn: str, tmp_path: Path,
                                                                      anomaly: str) -> None:  # fmt: skip
    """No ``call_specs``: the worker derives the shop's calls, the repro is RED with the victim's own exception,
    faithful, and GREEN once repaired."""
    root = source_copy(tmp_path / "app")
    worker = Worker(tmp_path / "out", postgres_dsn, root, copy_paths=["bench"], source_map={str(REPO): str(root)},
                    schema_sql=str(root / "bench" / "shop" / "schema.sql"))  # fmt: skip
    worker.worker.invariants = {"inventory": ["stock >= 0"]}
    [event] = await worker.feed(keyed(incident(anomaly), KEYS[anomaly]))
    assert isinstance(event, ReproEvent)
    assert (event.level, event.red.status, event.divergence.faithful) == ("app", "failed", True), event.red
    assert VICTIM[anomaly] in event.red.failure
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.repairs[0].strategy == STRATEGY[anomaly] and event.proven


# The shop's checkout as a service class holding its connection, with an async method (a sync psycopg connection:
# the gate patches psycopg's cursor), and as a coroutine function taking the connection.
SERVICE = """
from bench.shop.payments import allocate
from bench.shop.race import race_point


class Stock:
    def __init__(self, conn):
        self.conn = conn

    async def take(self, sku):
        with self.conn.transaction(), self.conn.cursor() as cur:
            (stock,) = cur.execute("SELECT stock FROM inventory WHERE sku = %s", (sku,)).fetchone()
            if stock < 1:
                raise LookupError(sku)
            race_point()
            (remaining,) = cur.execute("UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock",
                                       (sku,)).fetchone()
        allocate(sku, remaining)


async def take(conn, sku):
    await Stock(conn).take(sku)
"""


@pytest.mark.parametrize("function", ["svc.stock.Stock.take", "svc.stock.take"])
def test_a_method_and_a_coroutine_function_are_called_red(postgres_dsn: str, tmp_path: Path, function: str) -> None:
    """The oversell recorded in a method of an instance built with the connection, and in an ``async def``: the
    derived spec builds the instance / runs the coroutine, and the repro is RED with the victim's own exception."""
    root = source_copy(tmp_path / "app")
    (root / "svc").mkdir()
    (root / "svc" / "stock.py").write_text(SERVICE, encoding="utf-8")
    event = incident("invariant_violation")
    moved = {"function": function, "file": str(root / "svc" / "stock.py")}
    event = event.model_copy(update={"accesses": [a.model_copy(update=moved) for a in event.accesses]})
    derived = derive_call_specs(event, source_root=root)
    assert not derived.reasons, derived.reasons
    test = compile_repro(event, level="app", call_specs=derived.specs, source_root=str(root),
                         schema_sql=(root / "bench" / "shop" / "schema.sql").read_text(encoding="utf-8"))  # fmt: skip
    run, executed = run_repro(test, dsn=postgres_dsn, workdir=tmp_path / "red", source_root=str(root))
    assert run.status == "failed" and "Oversold" in run.failure, run.failure
    assert first_divergence(test.production_sequence, executed).faithful


# The shop's checkout as a Flask view on a SQLAlchemy engine (psycopg 3 driver, raw SQL through the engine), its app
# built by a factory taking the engine, as Flask apps are.
FLASK = """
from flask import Blueprint, Flask, current_app
from sqlalchemy.orm import Session

from bench.shop.payments import allocate
from bench.shop.race import race_point

bp = Blueprint("stock", __name__)


@bp.post("/stock/<sku>/take")
def take(sku):
    with Session(current_app.extensions["engine"]) as session, session.begin():
        sql = session.connection().exec_driver_sql
        (stock,) = sql("SELECT stock FROM inventory WHERE sku = %s", (sku,)).one()
        if stock < 1:
            return {"error": "sold out"}, 409
        race_point()
        (remaining,) = sql("UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock", (sku,)).one()
    allocate(sku, remaining)
    return {"stock": remaining}


def create_app(engine):
    app = Flask("stock")
    app.extensions["engine"] = engine
    app.register_blueprint(bp)
    return app
"""


def test_a_flask_view_is_requested_through_its_test_client_red(postgres_dsn: str, tmp_path: Path) -> None:
    """The oversell recorded in a Flask view: the derived spec requests ``POST /stock/<sku>/take`` with the recorded
    sku through ``app.test_client()`` of the app its factory builds on the scratch database; RED, faithful."""
    root = source_copy(tmp_path / "app")
    (root / "svc").mkdir()
    (root / "svc" / "web.py").write_text(FLASK, encoding="utf-8")
    event = incident("invariant_violation")
    moved = {"function": "svc.web.take", "file": str(root / "svc" / "web.py")}
    event = event.model_copy(update={"accesses": [a.model_copy(update=moved) for a in event.accesses]})
    derived = derive_call_specs(event, source_root=root)
    assert derived.specs["svc.web.take"] == CallSpec("svc.web:take", (), (("sku", Param(0, 0)),),
                                                     http=("POST", "/stock/<sku>/take"),
                                                     factory=("svc.web:create_app", "engine"))  # fmt: skip
    test = compile_repro(event, level="app", call_specs=derived.specs, source_root=str(root),
                         schema_sql=(root / "bench" / "shop" / "schema.sql").read_text(encoding="utf-8"))  # fmt: skip
    run, executed = run_repro(test, dsn=postgres_dsn, workdir=tmp_path / "red", source_root=str(root))
    assert run.status == "failed" and "Oversold" in run.failure, run.failure
    assert first_divergence(test.production_sequence, executed).faithful
