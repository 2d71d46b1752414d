"""Call specs derived for each code shape (methods, ``async def``, the shop's handlers and jobs), and the reasons
given for the ones a repro cannot call (route handlers, injected sessions, asyncpg, unrecorded arguments)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from processors.model.outputs import IncidentEvent
from processors.repro import CallSpec, Param
from processors.repro.app_level import RequestKey
from processors.repro.derive import derive_call_specs
from tests.repro.cases import REPO, incident

RECORDED = "svc.stock.take"  # the recorded code.function.name of the relocated incident's both sessions
SKU = (("sku", Param(0, 0)),)  # checkout's incident: ``SELECT stock FROM inventory WHERE sku = %s`` first


def relocated(tmp_path: Path, source: str, function: str = RECORDED, *, key: str = "") -> tuple[IncidentEvent, Path]:
    """The shop's oversell incident, its two sessions recorded as ``function`` in ``svc/stock.py`` (``source``)."""
    module = tmp_path / "svc" / "stock.py"
    module.parent.mkdir(parents=True, exist_ok=True)
    module.write_text(textwrap.dedent(source), encoding="utf-8")
    event = incident("invariant_violation")
    moved = {"function": function, "file": str(module), "idempotency_key": key}
    accesses = [a.model_copy(update=moved) for a in event.accesses]
    update = {"accesses": accesses, "culprit": event.culprit.model_copy(update=moved),
              "victim": event.victim.model_copy(update=moved)}  # fmt: skip
    return event.model_copy(update=update), tmp_path


def derived(tmp_path: Path, source: str, function: str = RECORDED, *, key: str = "") -> CallSpec | str:
    """The one spec derived for ``function``, or the reason it has none."""
    event, root = relocated(tmp_path, source, function, key=key)
    result = derive_call_specs(event, source_root=root)
    assert set(result.specs) | set(result.reasons) == {function}
    return result.specs.get(function) or result.reasons[function]


def test_a_coroutine_function_is_run_to_completion(tmp_path: Path) -> None:
    """``async def take(conn, sku)``: the spec says it is a coroutine function (the test runs it with asyncio.run)."""
    spec = derived(tmp_path, "async def take(conn, sku):\n    return sku\n")
    assert spec == CallSpec("svc.stock:take", (), SKU, coroutine=True)


def test_a_method_of_a_class_built_with_no_arguments(tmp_path: Path) -> None:
    """``Stock().take(conn, sku)``: no constructor of its own, no base class."""
    source = "class Stock:\n    def take(self, conn, sku):\n        return sku\n"
    assert derived(tmp_path, source, "svc.stock.Stock.take") == CallSpec("svc.stock:Stock.take", (), SKU,
                                                                         receiver="new")  # fmt: skip


def test_a_method_of_a_class_holding_the_connection(tmp_path: Path) -> None:
    """``Stock(conn).take(sku)``: the constructor's only required parameter is the connection; a commit on
    ``self.conn`` makes the connection transactional (not autocommit)."""
    source = """
        class Stock:
            def __init__(self, conn, retries=3):
                self.conn = conn

            async def take(self, sku):
                self.conn.commit()
    """
    assert derived(tmp_path, source, "svc.stock.Stock.take") == CallSpec(
        "svc.stock:Stock.take", (), SKU, autocommit=False, receiver="connection", coroutine=True
    )


def test_a_method_taking_nothing_on_an_instance_holding_the_connection(tmp_path: Path) -> None:
    """``Expiry(conn).run()``: a method with no parameter of its own; ``Stock.take(conn, ...)`` on a class whose
    constructor needs something else is refused with what it needs."""
    source = "class Expiry:\n    def __init__(self, db):\n        self.db = db\n    def run(self):\n        pass\n"
    assert derived(tmp_path, source, "svc.stock.Expiry.run") == CallSpec("svc.stock:Expiry.run", receiver="connection")
    needs = "class Stock:\n    def __init__(self, clock):\n        pass\n    def take(self, conn, sku):\n        pass\n"
    assert derived(tmp_path, needs, "svc.stock.Stock.take") == (
        "Stock.take(): Stock() needs clock: an instance can be built with no arguments or with the connection only"
    )


def test_static_and_class_methods_are_called_on_the_class(tmp_path: Path) -> None:
    """``@staticmethod``/``@classmethod``: called as ``Stock.take(conn, sku)``, no instance."""
    static = "class Stock:\n    @staticmethod\n    def take(conn, sku):\n        pass\n"
    assert derived(tmp_path, static, "svc.stock.Stock.take") == CallSpec("svc.stock:Stock.take", (), SKU)
    classmethod_ = "class Stock:\n    @classmethod\n    def take(cls, conn, sku):\n        pass\n"
    assert derived(tmp_path, classmethod_, "svc.stock.Stock.take") == CallSpec("svc.stock:Stock.take", (), SKU)


def test_a_class_whose_instance_cannot_be_built_is_explained(tmp_path: Path) -> None:
    """A constructor needing more than the connection, or inherited: the reason names what it needs."""
    needs = "class Stock:\n    def __init__(self, conn, clock):\n        pass\n    def take(self, sku):\n        pass\n"
    assert derived(tmp_path, needs, "svc.stock.Stock.take") == (
        "Stock.take(): neither its first parameter nor Stock()'s only required one is a connection "
        "(conn, connection, cur, cursor, db, session)"
    )
    inherited = "class Stock(Base):\n    def take(self, conn, sku):\n        pass\n"
    assert derived(tmp_path, inherited, "svc.stock.Stock.take") == (
        "Stock.take(): Stock has a base class or decorator and no __init__ of its own: how to build an instance is "
        "not known statically"
    )


def test_a_flask_view_reading_its_body_says_what_a_call_would_need(tmp_path: Path) -> None:
    """A Flask route handler is not called directly; the reason names its route, the path parameter and the body the
    telemetry does not carry (read through a helper)."""
    source = """
        from flask import Blueprint, request
        bp = Blueprint("stock", __name__)

        def _args():
            return request.get_json()["args"]

        @bp.post("/stock/<sku>/take")
        def take(sku):
            return _args()
    """
    assert derived(tmp_path, source) == (
        "take() is a route handler (@bp.post('/stock/<sku>/take')): it runs behind the framework (its decorators, "
        "middleware and dependencies), so it is not called directly, and calls through the framework's test client "
        "are not derived; such a call needs sku from the recorded URL's path parameters (url.path against "
        "http.route); the request body it reads, which the telemetry does not carry (record it on the request's "
        "span, or write a call spec: [repro] call_specs)"
    )


def test_a_flask_view_without_an_app_factory_says_so(tmp_path: Path) -> None:
    """A Flask view whose arguments are all the rule's: requested through the test client of the app a factory
    builds (tests/repro/test_derive_worker.py runs one); without a factory taking the engine or the DSN, the reason
    says so."""
    source = """
        from flask import Flask
        app = Flask(__name__)

        @app.route("/stock/<sku>/take", methods=["POST"])
        def take(sku):
            pass
    """
    assert derived(tmp_path, source) == (
        "take() is a Flask view (@app.route('/stock/<sku>/take')): no app factory in its module (app_factory, "
        "build_app, create_app, make_app) takes the engine or the DSN first, so the test cannot point the app at "
        "the scratch database"
    )
    factory = "\n\ndef create_app(dsn):\n    return app\n"
    assert derived(tmp_path, textwrap.dedent(source) + factory) == CallSpec(
        "svc.stock:take", (), SKU, http=("POST", "/stock/<sku>/take"), factory=("svc.stock:create_app", "dsn")
    )


def test_a_fastapi_handler_with_an_injected_session_and_a_django_view(tmp_path: Path) -> None:
    """FastAPI's ``Depends`` names the injected session; a Django view is told by its ``request`` parameter."""
    fastapi = """
        from fastapi import APIRouter, Depends
        router = APIRouter()

        @router.post("/stock/{sku}/take")
        async def take(sku: str, session=Depends(get_session)):
            pass
    """
    why = derived(tmp_path, fastapi)
    assert isinstance(why, str)
    assert why.startswith("take() is a route handler (@router.post('/stock/{sku}/take'))")
    assert why.endswith("such a call needs sku from the recorded URL's path parameters (url.path against "
                        "http.route); the injected session = Depends(get_session) pointed at the scratch "
                        "database")  # fmt: skip
    django = "def take(request, sku):\n    return request.POST['n']\n"
    why = derived(tmp_path, django)
    assert isinstance(why, str)
    assert why.startswith("take() is a Django view (its first parameter is the request)")
    assert "the request body it reads" in why


def test_asyncpg_and_other_decorators_are_refused_with_the_reason(tmp_path: Path) -> None:
    """asyncpg is not the driver the gate patches; an unknown decorator hides the signature."""
    assert derived(tmp_path, "import asyncpg\nasync def take(conn, sku):\n    pass\n") == (
        "stock.py uses asyncpg: the application-level repro schedules psycopg 3 statements only (its cursor is what "
        "it patches); the SQL-level repro replays them"
    )
    assert derived(tmp_path, "@retry(3)\ndef take(conn, sku):\n    pass\n") == (
        "take() is decorated (@retry): its wrapper's signature is not known statically"
    )


def test_an_unrecorded_argument_names_what_would_supply_it(tmp_path: Path) -> None:
    """A parameter nothing binds; an idempotency key the spans did not carry (and bound when they did)."""
    assert derived(tmp_path, "def take(conn, sku, quantity):\n    pass\n") == (
        "take(): no recorded value for its parameter 'quantity' (no statement of the session on the incident's "
        "rows compares or stores a column of that name, nor <table>.id as <table>_id; a call spec in [repro] "
        "call_specs can supply it)"
    )
    keyed = "def take(conn, sku, idempotency_key):\n    pass\n"
    assert derived(tmp_path, keyed) == (
        "take(): its parameter 'idempotency_key' is the request's idempotency key, which its statements' spans do "
        "not carry (record it on them: [decode] idempotency_key_attribute)"
    )
    assert derived(tmp_path, keyed, key="k-1") == CallSpec("svc.stock:take", (), (*SKU, ("idempotency_key",
                                                                                          RequestKey())))  # fmt: skip


def on_stack(stack: str, view: str) -> str:
    """The reason derived for a corpus stack's view, its sessions recorded in ``bench/corpus/stacks/<stack>``."""
    event = incident("invariant_violation")
    moved = {"function": f"bench.corpus.stacks.{stack}.app.{view}",
             "file": str(REPO / "bench" / "corpus" / "stacks" / stack / "app.py")}  # fmt: skip
    event = event.model_copy(update={"accesses": [a.model_copy(update=moved) for a in event.accesses]})
    [(_, why)] = derive_call_specs(event, source_root=REPO).reasons.items()
    return why


def test_the_corpus_stacks_views_say_what_their_calls_lack() -> None:
    """The ORM stacks' lost-update views, as written: Flask's reads its body through a helper, Django's is wrapped
    into a view that parses the body, FastAPI's takes a pydantic body and an injected asyncpg connection."""
    behind = ("it runs behind the framework (its decorators, middleware and dependencies), so it is not called "
              "directly, and calls through the framework's test client are not derived; such a call needs "
              "account_no from the recorded URL's path parameters (url.path against http.route); ")  # fmt: skip
    record = " (record it on the request's span, or write a call spec: [repro] call_specs)"
    assert on_stack("flask_sqlalchemy", "deposit") == (
        f"deposit() is a route handler (@bp.post('/accounts/<account_no>/deposits')): {behind}the request body it "
        f"reads, which the telemetry does not carry{record}"
    )
    assert on_stack("django_orm", "deposit") == (
        f"deposit() is wrapped by @endpoint into a view taking the request: {behind}amount from the request body, "
        f"which the telemetry does not carry{record}"
    )
    assert on_stack("fastapi_asyncpg", "deposit") == (
        "app.py uses asyncpg: the application-level repro schedules psycopg 3 statements only (its cursor is what it "
        "patches); the SQL-level repro replays them"
    )


@pytest.mark.parametrize(
    ("anomaly", "function", "spec"),
    [
        ("invariant_violation", "shop.handlers.checkout", CallSpec("bench.shop.handlers:checkout", (), SKU)),
        ("lost_update", "shop.jobs.expire_cart", CallSpec("bench.shop.jobs:expire_cart", (), (("order_id",
                                                                                                Param(0, 0)),))),
    ],
)  # fmt: skip
def test_the_shops_functions_are_derived(anomaly: str, function: str, spec: CallSpec) -> None:
    """The shop's checkout and expire_cart, as captured: the recorded values bind every argument; the fixes' flag
    keeps its default (the path production ran)."""
    assert derive_call_specs(incident(anomaly), source_root=REPO).specs[function] == spec


def test_the_shops_keyed_handlers_need_the_key_on_their_spans() -> None:
    """capture_payment and charge take the request's idempotency key: the golden incidents were captured before the
    shop stamped it on its statements, so the reason says so; with the key recorded, both derive."""
    lost = incident("lost_update")
    assert derive_call_specs(lost, source_root=REPO).reasons == {
        "shop.handlers.capture_payment": "capture_payment(): its parameter 'idempotency_key' is the request's "
        "idempotency key, which its statements' spans do not carry (record it on them: [decode] "
        "idempotency_key_attribute)"
    }
    keyed = lost.model_copy(update={"accesses": [a.model_copy(update={"idempotency_key": "cap-1000"})
                                                 for a in lost.accesses]})  # fmt: skip
    assert derive_call_specs(keyed, source_root=REPO).specs["shop.handlers.capture_payment"] == CallSpec(
        "bench.shop.handlers:capture_payment", (), (("order_id", Param(0, 0)), ("idempotency_key", RequestKey()))
    )
    double = incident("duplicate_apply")
    double = double.model_copy(update={"accesses": [a.model_copy(update={"idempotency_key": "pay-1009"})
                                                    for a in double.accesses]})  # fmt: skip
    assert derive_call_specs(double, source_root=REPO).specs["shop.handlers.charge"] == CallSpec(
        "bench.shop.handlers:charge",
        (),
        (("order_id", Param(0, 0)), ("amount", Param(0, 1)), ("idempotency_key", RequestKey())),
    )
