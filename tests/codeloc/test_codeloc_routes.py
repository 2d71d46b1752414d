"""Route and method of a request -> its handler in the checkout (Flask, FastAPI, Django), parsed with libcst."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.api.telemetry import Telemetry
from processors.codeloc import Site
from processors.pipeline.accesses import accesses_of
from processors.sql import SqlAccessExtractor
from tests.codeloc.sample import checkout, client, line_of, locator, server, trace

FLASK = {
    "bank/app.py": """
        from flask import Blueprint, Flask
        from sqlalchemy import text

        from bank.db import session

        app = Flask(__name__)
        accounts = Blueprint("accounts", __name__, url_prefix="/accounts")


        @accounts.route("/<int:account_id>/withdraw", methods=["POST"])
        def withdraw(account_id):
            row = session.execute(text("SELECT balance FROM accounts WHERE id = :id"), {"id": account_id}).one()
            new = {"b": row[0] - 10, "id": account_id}
            session.execute(text("UPDATE accounts SET balance = :b WHERE id = :id"), new)
            session.commit()


        @accounts.get("/<int:account_id>")
        def show(account_id):
            return session.execute(text("SELECT balance FROM accounts WHERE id = :id"), {"id": account_id}).one()


        @app.route("/health")
        def health():
            return "ok"


        app.register_blueprint(accounts, url_prefix="/api/accounts")
    """,
    "bank/db.py": "session = None\n",
}

FASTAPI = {
    "rooms/api.py": """
        from fastapi import APIRouter, FastAPI

        router = APIRouter(prefix="/rooms")


        @router.post("/{room_id}/bookings")
        async def book(room_id: int):
            await conn.execute("INSERT INTO bookings (room_id) VALUES ($1)", room_id)


        @router.get("/{room_id}/bookings")
        async def list_bookings(room_id: int):
            return await conn.fetch("SELECT * FROM bookings WHERE room_id = $1", room_id)


        app = FastAPI()
        app.include_router(router, prefix="/v1")
    """,
}

DJANGO = {
    "site/urls.py": """
        from django.urls import include, path

        urlpatterns = [path("api/", include("rota.urls"))]
    """,
    "rota/__init__.py": "",
    "rota/urls.py": """
        from django.urls import path

        from . import views

        urlpatterns = [
            path("doctors/<str:name>/off-call/", views.go_off_call, name="off-call"),
            path("shifts/<int:shift>/", views.ShiftView.as_view()),
        ]
    """,
    "rota/models.py": """
        from django.db import models


        class Doctor(models.Model):
            name = models.TextField(unique=True)
            shift = models.IntegerField()
            on_call = models.BooleanField()
    """,
    "rota/views.py": """
        from django.views import View

        from rota.models import Doctor


        def go_off_call(request, name):
            doctor = Doctor.objects.get(name=name)
            doctor.on_call = False
            doctor.save()


        class ShiftView(View):
            def get(self, request, shift):
                return Doctor.objects.filter(shift=shift)

            def post(self, request, shift):
                Doctor.objects.filter(shift=shift).update(on_call=True)
    """,
}


def _site(root: Path, method: str, route: str, statement: str = "SELECT 1") -> Site | None:
    t = trace(server(1, method, route), client(2, 1, statement))
    return locator(root).sites(t, [t.spans[1]]).get(t.spans[1].span_id)


def test_flask_route_and_method_name_the_blueprint_handler_and_the_line_that_issues_the_statement(
    tmp_path: Path,
) -> None:
    """``@bp.route(..., methods=[...])`` under the blueprint's prefix (or where it is mounted); ``@bp.get``."""
    root = checkout(tmp_path, FLASK)
    app = str(root / "bank/app.py")
    update = "UPDATE accounts SET balance = %(b)s WHERE id = %(id)s"  # what the driver sent for text(...)
    line = line_of(root, "bank/app.py", "UPDATE accounts")
    for route in ("/accounts/<int:account_id>/withdraw", "/api/accounts/<int:account_id>/withdraw"):
        assert _site(root, "POST", route, update) == Site("bank.app.withdraw", app, line, "route")
    show = line_of(root, "bank/app.py", "def show")
    assert _site(root, "GET", "/accounts/<int:account_id>", "SELECT now()") == Site("bank.app.show", app, show, "route")
    assert _site(root, "GET", "/health") == Site("bank.app.health", app, line_of(root, "bank/app.py", "def health"),
                                                 "route")  # fmt: skip


def test_fastapi_method_decides_between_two_handlers_of_one_route(tmp_path: Path) -> None:
    """``@router.post`` and ``@router.get`` on one path: the span's method picks the handler."""
    root = checkout(tmp_path, FASTAPI)
    api = str(root / "rooms/api.py")
    post = _site(root, "POST", "/v1/rooms/{room_id}/bookings", "INSERT INTO bookings (room_id) VALUES ($1)")
    assert post == Site("rooms.api.book", api, line_of(root, "rooms/api.py", "INSERT INTO"), "route")
    get = _site(root, "GET", "/rooms/{room_id}/bookings", "SELECT * FROM bookings WHERE room_id = $1")
    assert get == Site("rooms.api.list_bookings", api, line_of(root, "rooms/api.py", "SELECT *"), "route")


def test_django_urlpatterns_through_include_name_function_and_class_based_views(tmp_path: Path) -> None:
    """``path("api/", include("rota.urls"))`` then ``path(..., views.fn)`` / ``views.Cls.as_view()``."""
    root = checkout(tmp_path, DJANGO)
    views = str(root / "rota/views.py")
    off = _site(root, "POST", "api/doctors/<str:name>/off-call/")
    assert off == Site("rota.views.go_off_call", views, line_of(root, "rota/views.py", "def go_off_call"), "route")
    post = _site(root, "POST", "api/shifts/<int:shift>/")
    assert post == Site("rota.views.ShiftView.post", views, line_of(root, "rota/views.py", "def post"), "route")
    get = _site(root, "GET", "api/shifts/<int:shift>/")
    assert get == Site("rota.views.ShiftView.get", views, line_of(root, "rota/views.py", "def get"), "route")


def test_accesses_of_a_trace_without_code_attributes_name_the_handler_and_how(tmp_path: Path) -> None:
    """The wiring: a stock trace (no ``code.*``) gets its handler from the checkout; ``code.*`` still wins."""
    root = checkout(tmp_path, FLASK)
    update = "UPDATE accounts SET balance = %s WHERE id = %s"  # psycopg2 style, :b in the code
    t = trace(server(1, "POST", "/accounts/<int:account_id>/withdraw"), client(2, 1, update, params=(90, 7)))
    extractor = SqlAccessExtractor(key_columns={"accounts": ["id"]})
    [bare] = accesses_of(t, extractor)
    assert (bare.function, bare.file, bare.located_by) == ("", "", "")
    [located] = accesses_of(t, extractor, locator(root))
    assert (located.function, located.file, located.line, located.located_by, located.candidates) == (
        "bank.app.withdraw", str(root / "bank/app.py"), line_of(root, "bank/app.py", "UPDATE accounts"), "route", ()
    )  # fmt: skip
    code = {"code_function": "bank.views.w", "code_file": "/srv/bank/views.py", "code_line": 3}
    named = trace(
        server(1, "POST", "/accounts/<int:account_id>/withdraw", **code), client(2, 1, update, params=(90, 7))
    )
    [kept] = accesses_of(named, extractor, locator(root))
    assert (kept.function, kept.file, kept.line, kept.located_by) == ("bank.views.w", "/srv/bank/views.py", 3,
                                                                      "code_attributes")  # fmt: skip


def test_a_route_no_handler_declares_is_not_located(tmp_path: Path) -> None:
    """An unknown route and a statement no code passes: no site (never a guess)."""
    root = checkout(tmp_path, FLASK)
    assert _site(root, "POST", "/nowhere", "DELETE FROM audit_log") is None


def test_a_locator_that_fails_costs_the_location_not_the_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose locating raises is counted (``locate_error``) and its accesses go on, unlocated."""
    root = checkout(tmp_path, FLASK)
    telemetry = Telemetry("codeloc")
    loc = locator(root, telemetry)

    def broken(*_: object) -> list[Site | None]:
        raise RecursionError("deep")

    monkeypatch.setattr(loc, "_request_sites", broken)
    update = "UPDATE accounts SET balance = %s WHERE id = %s"
    t = trace(server(1, "POST", "/accounts/<int:account_id>/withdraw"), client(2, 1, update, params=(90, 7)))
    [access] = accesses_of(t, SqlAccessExtractor(key_columns={"accounts": ["id"]}), loc)
    assert (access.entity, access.function, access.located_by) == ("accounts:7", "", "")
    assert telemetry.dropped["locate_error"] == 1


def test_django_orm_sql_without_a_known_route_names_the_view_by_model_and_columns(tmp_path: Path) -> None:
    """What Django sends for ``Doctor.objects.get(name=...)`` then ``save()`` (quoted, ``<app>_<model>``): the
    functions that name ``Doctor``, filter on ``name`` and assign a column it sets: only ``go_off_call``."""
    root = checkout(tmp_path, DJANGO)
    select = ('SELECT "rota_doctor"."id", "rota_doctor"."name", "rota_doctor"."shift", "rota_doctor"."on_call" '
              'FROM "rota_doctor" WHERE "rota_doctor"."name" = %s LIMIT 21')  # fmt: skip
    update = ('UPDATE "rota_doctor" SET "name" = %s, "shift" = %s, "on_call" = %s '
              'WHERE "rota_doctor"."id" = %s')  # fmt: skip
    spans = [client(2, 1, select), client(3, 1, update)]
    t = trace(server(1, "POST", "somewhere/else/"), *spans)
    found = locator(root).sites(t, spans)
    off = line_of(root, "rota/views.py", "def go_off_call")
    assert [found[s.span_id] for s in spans] == [Site("rota.views.go_off_call", str(root / "rota/views.py"), off,
                                                      "statement")] * 2  # fmt: skip


def test_flask_method_views_and_fastapi_routes_added_by_call(tmp_path: Path) -> None:
    """``app.add_url_rule(path, view_func=View.as_view(...))``: the view's method for the request's verb;
    ``router.add_api_route(path, endpoint, methods=[...])``."""
    root = checkout(tmp_path, {
        "svc/views.py": """
            from flask import Flask
            from flask.views import MethodView

            app = Flask(__name__)


            class AccountView(MethodView):
                def get(self, account_id):
                    return db.execute("SELECT balance FROM accounts WHERE id = %s", (account_id,))

                def put(self, account_id):
                    db.execute("UPDATE accounts SET balance = %s WHERE id = %s", (0, account_id))


            async def close(account_id: int):
                await conn.execute("DELETE FROM accounts WHERE id = $1", account_id)


            app.add_url_rule("/accounts/<int:account_id>", view_func=AccountView.as_view("account"))
            router.add_api_route("/accounts/{account_id}", close, methods=["DELETE"])
        """,
    })  # fmt: skip
    file = str(root / "svc/views.py")
    put = _site(root, "PUT", "/accounts/<int:account_id>")
    assert put == Site("svc.views.AccountView.put", file, line_of(root, "svc/views.py", "def put"), "route")
    get = _site(root, "GET", "/accounts/<int:account_id>")
    assert get == Site("svc.views.AccountView.get", file, line_of(root, "svc/views.py", "def get"), "route")
    close = _site(root, "DELETE", "/accounts/{account_id}")
    assert close == Site("svc.views.close", file, line_of(root, "svc/views.py", "def close"), "route")
