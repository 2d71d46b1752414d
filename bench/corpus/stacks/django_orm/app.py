"""The corpus's lost update, write skew and phantom as Django views on the Django ORM (psycopg 3 backend).

Traced by the stock ``opentelemetry-instrumentation-django`` (its middleware: a SERVER span per request,
``http.route`` the URL pattern) and, for the statements, the stock instrumentation of the driver Django uses,
``opentelemetry-instrumentation-psycopg``, both with their default options: statements as Django renders them
(``"corpus_accounts"."account_no" = %s``), no parameters, no ``code.*``. ``transaction.atomic()`` delimits each
request's transaction (READ COMMITTED, the database's default); BEGIN and COMMIT are not statements, so not spans.

The views are the corpus's handlers (``bench.corpus.apps``) as a Django user writes them: ``objects.get`` then
``save()`` (lost update), ``filter(...).count()`` then ``save()`` of the own row (write skew), ``exists()`` then
``objects.create`` (phantom); the controls ``select_for_update()``, ``update(balance=F("balance") + x)``, the
``serializable`` database alias with one retry, and the unique constraint with the ``IntegrityError`` caught.

Django is configured once per process, on import (``settings.configure``: no settings module); :func:`start` points
its two database aliases at the test's PostgreSQL and schema before the first connection.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

import django
from django.conf import settings

if not settings.configured:
    settings.configure(
        DATABASES={alias: {"ENGINE": "django.db.backends.postgresql"} for alias in ("default", "serializable")},
        INSTALLED_APPS=[], ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, MIDDLEWARE=[], USE_TZ=True,
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )  # fmt: skip
    django.setup()

from django.db import IntegrityError, OperationalError, connections, models, transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.test import Client
from django.urls import path as url
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from psycopg import IsolationLevel
from psycopg.errors import SerializationFailure

from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom, RoomTaken
from bench.corpus.apps.write_skew import LastOnCall, WriteSkew
from bench.corpus.race import race_point
from bench.corpus.scenario import BUG, RoundPlan, Scenario
from bench.corpus.service import Refused
from bench.corpus.stacks.web import TRACE_HEADER, Reply, View, all_plans, current_trace_id

STACK = "django_orm"
OFFSET = 200  # this stack's rounds are numbered from 201


class Account(models.Model):
    account_no = models.TextField(primary_key=True)
    balance = models.IntegerField()

    class Meta:
        app_label = "corpus"
        db_table = "corpus_accounts"


class Doctor(models.Model):
    name = models.TextField(primary_key=True)
    shift = models.IntegerField()
    on_call = models.BooleanField()

    class Meta:
        app_label = "corpus"
        db_table = "corpus_doctors"


class Booking(models.Model):
    booking_id = models.AutoField(primary_key=True)
    room = models.IntegerField()
    day = models.TextField()
    guest = models.TextField()

    class Meta:
        app_label = "corpus"
        db_table = "corpus_bookings"


class SafeBooking(models.Model):
    booking_id = models.AutoField(primary_key=True)
    room = models.IntegerField()
    day = models.TextField()
    guest = models.TextField()

    class Meta:
        app_label = "corpus"
        db_table = "corpus_bookings_safe"


Endpoint = Callable[..., dict[str, Any]]


def endpoint(fn: Endpoint) -> Callable[..., JsonResponse]:
    """A POST view: ``fn(key, *args)`` from the URL and the JSON body; a refusal answers 409. The response carries
    the trace id of the request's span (made current by the instrumentation's middleware)."""

    @wraps(fn)
    def view(request: HttpRequest, key: Any) -> JsonResponse:
        args = json.loads(request.body)["args"][1:]
        try:
            response = JsonResponse(fn(key, *args))
        except Refused as exc:
            response = JsonResponse({"error": f"{type(exc).__name__}: {exc}"}, status=exc.status)
        response[TRACE_HEADER] = current_trace_id()
        return response

    return view


# -- lost update -----------------------------------------------------------------------------------------------------
@endpoint
def deposit(account_no: str, amount: int) -> dict[str, Any]:
    """Buggy: ``objects.get``, the balance changed on the instance, ``save()``."""
    with transaction.atomic():
        account = Account.objects.get(pk=account_no)
        race_point()
        account.balance += amount
        account.save()
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": account.balance}


@endpoint
def deposit_locked(account_no: str, amount: int) -> dict[str, Any]:
    """Control: ``select_for_update().get``: a concurrent deposit waits and reads our result."""
    with transaction.atomic():
        race_point()
        account = Account.objects.select_for_update().get(pk=account_no)
        account.balance += amount
        account.save()
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": account.balance}


@endpoint
def deposit_atomic(account_no: str, amount: int) -> dict[str, Any]:
    """Control: the same unlocked read, then ``update(balance=F("balance") + x)``."""
    with transaction.atomic():
        Account.objects.get(pk=account_no)
        race_point()
        Account.objects.filter(pk=account_no).update(balance=F("balance") + amount)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no}


# -- write skew ------------------------------------------------------------------------------------------------------
def _off_call(name: str, shift: int, using: str = "default") -> int:
    doctors = Doctor.objects.using(using)
    on_call = doctors.filter(shift=shift, on_call=True).count()
    if on_call < 2:
        raise LastOnCall(f"{name} is the last doctor on call in shift {shift}")
    race_point()
    doctor = doctors.get(pk=name)
    doctor.on_call = False
    doctor.save(using=using)
    race_point("written")
    return int(on_call)


@endpoint
def go_off_call(name: str, shift: int) -> dict[str, Any]:
    """Buggy: the count is not protected against a concurrent change of another doctor's row."""
    with transaction.atomic():
        on_call = _off_call(name, shift)
    race_point("committed")
    return {"name": name, "on_call_before": on_call}


@endpoint
def go_off_call_locked(name: str, shift: int) -> dict[str, Any]:
    """Control: the doctors on call read with ``select_for_update()``; a concurrent request waits and re-checks."""
    with transaction.atomic():
        race_point()
        names = list(Doctor.objects.select_for_update().filter(shift=shift, on_call=True)
                     .values_list("name", flat=True))  # fmt: skip
        if len(names) < 2 or name not in names:
            raise LastOnCall(f"{name} cannot go off call: on call in shift {shift}: {names}")
        doctor = Doctor.objects.get(pk=name)
        doctor.on_call = False
        doctor.save()
        race_point("written")
    race_point("committed")
    return {"name": name, "on_call_before": len(names)}


@endpoint
def go_off_call_serializable(name: str, shift: int) -> dict[str, Any]:
    """Control: the buggy transaction on the ``serializable`` alias, retried once after a serialization failure."""
    for attempt in (1, 2):
        try:
            with transaction.atomic(using="serializable"):
                try:
                    on_call = _off_call(name, shift, using="serializable")
                except LastOnCall as refused:
                    raise LastOnCall(f"{refused} (attempt {attempt})") from None
        except OperationalError as exc:
            if attempt == 2 or not isinstance(exc.__cause__, SerializationFailure):
                raise
            continue
        race_point("committed")
        return {"name": name, "on_call_before": on_call, "attempts": attempt}
    raise AssertionError("unreachable")


# -- phantom ---------------------------------------------------------------------------------------------------------
@endpoint
def book(room: int, day: str, guest: str) -> dict[str, Any]:
    """Buggy: ``exists()`` then ``objects.create``, with nothing making the two atomic."""
    with transaction.atomic():
        if Booking.objects.filter(room=room, day=day).exists():
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        booking = Booking.objects.create(room=room, day=day, guest=guest)
        race_point("written")
    race_point("committed")
    return {"room": room, "booking_id": booking.booking_id}


@endpoint
def book_safe(room: int, day: str, guest: str) -> dict[str, Any]:
    """Control: ``UNIQUE (room, day)`` decides; the loser's insert fails and its ``IntegrityError`` is a 409."""
    try:
        with transaction.atomic():
            if SafeBooking.objects.filter(room=room, day=day).exists():
                raise RoomTaken(f"room {room} is booked on {day}")
            race_point()
            booking = SafeBooking.objects.create(room=room, day=day, guest=guest)
            race_point("written")
    except IntegrityError:
        raise RoomTaken(f"room {room} was booked on {day} meanwhile") from None
    race_point("committed")
    return {"room": room, "booking_id": booking.booking_id}


urlpatterns = [
    url("accounts/<str:key>/deposits", deposit),
    url("accounts/<str:key>/locked-deposits", deposit_locked),
    url("accounts/<str:key>/atomic-deposits", deposit_atomic),
    url("doctors/<str:key>/off-call", go_off_call),
    url("doctors/<str:key>/locked-off-call", go_off_call_locked),
    url("doctors/<str:key>/serializable-off-call", go_off_call_serializable),
    url("rooms/<int:key>/bookings", book),
    url("rooms/<int:key>/safe-bookings", book_safe),
]
RULES = {p.callback.__name__: f"/{p.pattern}" for p in urlpatterns}


def _view(fn: Callable[..., Any]) -> View:
    return View(RULES[fn.__name__], fn)


VIEWS: dict[str, dict[str, View]] = {
    LostUpdate.name: {BUG: _view(deposit), "control:for_update": _view(deposit_locked),
                      "control:atomic_update": _view(deposit_atomic)},
    WriteSkew.name: {BUG: _view(go_off_call), "control:for_update": _view(go_off_call_locked),
                     "control:serializable_retry": _view(go_off_call_serializable)},
    Phantom.name: {BUG: _view(book), "control:unique_on_conflict": _view(book_safe)},
}  # fmt: skip


def plans() -> list[tuple[Scenario, list[RoundPlan]]]:
    """One round of every kind of every scenario, numbered from this stack's offset."""
    return all_plans(VIEWS, OFFSET)


@dataclass
class Running:
    """Django in this process behind its test client, traced to a Collector."""

    provider: TracerProvider

    def send(self, path: str, body: dict[str, Any]) -> Reply:
        try:
            response = Client(raise_request_exception=False).post(path, body, content_type="application/json")
        finally:
            connections.close_all()  # this thread's connections (the test client keeps them open)
        try:
            data = json.loads(response.content)
        except ValueError:
            data = {"error": response.content.decode(errors="replace")[:500]}
        return Reply(response.status_code, response.get(TRACE_HEADER, ""), data)

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        finally:
            DjangoInstrumentor().uninstrument()
            PsycopgInstrumentor().uninstrument()


def start(dsn: str, schema: str, otlp_endpoint: str) -> Running:
    """Django on ``dsn`` (tables found through ``search_path=schema``), traced by the stock Django and psycopg
    instrumentations with default options, exporting OTLP/HTTP to ``otlp_endpoint``."""
    from urllib.parse import urlsplit

    parts = urlsplit(dsn)
    for alias, database in settings.DATABASES.items():
        database.update(NAME=parts.path.lstrip("/") or "postgres", USER=parts.username or "",
                        PASSWORD=parts.password or "", HOST=parts.hostname or "", PORT=str(parts.port or ""),
                        OPTIONS={"options": f"-c search_path={schema}"})  # fmt: skip
        if alias == "serializable":
            database["OPTIONS"]["isolation_level"] = IsolationLevel.SERIALIZABLE
    provider = TracerProvider(resource=Resource.create({"service.name": f"corpus-{STACK}",
                                                        "service.version": "1.0.0"}))  # fmt: skip
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces"),
                                                   schedule_delay_millis=200))  # fmt: skip
    DjangoInstrumentor().instrument(tracer_provider=provider)
    PsycopgInstrumentor().instrument(tracer_provider=provider)
    return Running(provider)
