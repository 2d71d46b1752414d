"""The corpus's lost update, write skew and phantom as a Flask app on the SQLAlchemy 2 ORM (psycopg 3 driver).

Traced by the stock ``opentelemetry-instrumentation-flask`` and ``-sqlalchemy`` with their default options: a SERVER
span per request (``http.route`` the Flask rule) and a CLIENT span per statement, as SQLAlchemy renders it
(``accounts.account_no = %(pk_1)s::VARCHAR``), with no parameters and no ``code.*``. Spans go through a
``BatchSpanProcessor`` and the stock OTLP/HTTP exporter to a Collector. Each request opens its own ``Session`` (one
transaction, READ COMMITTED, the database's default); ``session.flush()`` before the commit sends the write while
the transaction is still open, which is where the corpus's ``written`` race point belongs.

The views are the corpus's handlers (``bench.corpus.apps``) as an ORM user writes them: ``session.get`` then an
attribute changed (lost update), a ``count()`` then the own row changed (write skew), a "none exists" query then
``session.add`` (phantom); the controls ``with_for_update()``, ``update().values(balance=balance + x)``,
SERIALIZABLE with one retry, and the unique constraint with ``ON CONFLICT DO NOTHING``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.flask import FlaskInstrumentor
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from psycopg.errors import SerializationFailure
from sqlalchemy import Boolean, Engine, Integer, String, create_engine, func, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom, RoomTaken
from bench.corpus.apps.write_skew import LastOnCall, WriteSkew
from bench.corpus.race import race_point
from bench.corpus.scenario import BUG, RoundPlan, Scenario
from bench.corpus.service import Refused
from bench.corpus.stacks.web import TRACE_HEADER, Reply, View, all_plans, current_trace_id

STACK = "flask_sqlalchemy"
OFFSET = 100  # this stack's rounds are numbered from 101

bp = Blueprint("corpus", __name__)  # the views; ``create_app`` registers it on an app with its engine


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "corpus_accounts"
    account_no: Mapped[str] = mapped_column(String, primary_key=True)
    balance: Mapped[int] = mapped_column(Integer)


class Doctor(Base):
    __tablename__ = "corpus_doctors"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    shift: Mapped[int] = mapped_column(Integer)
    on_call: Mapped[bool] = mapped_column(Boolean)


class Booking(Base):
    __tablename__ = "corpus_bookings"
    booking_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    room: Mapped[int] = mapped_column(Integer)
    day: Mapped[str] = mapped_column(String)
    guest: Mapped[str] = mapped_column(String)


class SafeBooking(Base):
    __tablename__ = "corpus_bookings_safe"
    booking_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    room: Mapped[int] = mapped_column(Integer)
    day: Mapped[str] = mapped_column(String)
    guest: Mapped[str] = mapped_column(String)


def _session() -> Session:
    engine: Engine = current_app.extensions["engine"]
    return Session(engine)


def _args() -> list[Any]:
    return list((request.get_json() or {})["args"])


# -- lost update -----------------------------------------------------------------------------------------------------
def _account(session: Session, account_no: str, *, lock: bool = False) -> Account:
    account = session.get(Account, account_no, with_for_update=lock)
    if account is None:
        raise Refused(f"no account {account_no}")
    return account


@bp.post("/accounts/<account_no>/deposits")
def deposit(account_no: str) -> dict[str, Any]:
    """Buggy: ``session.get``, the balance changed on the object, flushed and committed."""
    amount = _args()[1]
    with _session() as session, session.begin():
        account = _account(session, account_no)
        race_point()
        account.balance += amount
        session.flush()
        balance = account.balance  # (read before the commit expires it)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": balance}


@bp.post("/accounts/<account_no>/locked-deposits")
def deposit_locked(account_no: str) -> dict[str, Any]:
    """Control: ``session.get(..., with_for_update=True)``: a concurrent deposit waits and reads our result."""
    amount = _args()[1]
    with _session() as session, session.begin():
        race_point()
        account = _account(session, account_no, lock=True)
        account.balance += amount
        session.flush()
        balance = account.balance  # (read before the commit expires it)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": balance}


@bp.post("/accounts/<account_no>/atomic-deposits")
def deposit_atomic(account_no: str) -> dict[str, Any]:
    """Control: the same unlocked read, then ``UPDATE ... SET balance = balance + x`` (no value computed here)."""
    amount = _args()[1]
    with _session() as session, session.begin():
        _account(session, account_no)
        race_point()
        session.execute(update(Account).where(Account.account_no == account_no)
                        .values(balance=Account.balance + amount))  # fmt: skip
        race_point("written")
    race_point("committed")
    return {"account_no": account_no}


# -- write skew ------------------------------------------------------------------------------------------------------
def _off_call(session: Session, name: str, shift: int) -> int:
    on_call = session.scalar(select(func.count()).select_from(Doctor).where(Doctor.shift == shift, Doctor.on_call))
    if (on_call or 0) < 2:
        raise LastOnCall(f"{name} is the last doctor on call in shift {shift}")
    race_point()
    doctor = session.get(Doctor, name)
    if doctor is None:
        raise Refused(f"no doctor {name}")
    doctor.on_call = False
    session.flush()
    race_point("written")
    return int(on_call or 0)


@bp.post("/doctors/<name>/off-call")
def go_off_call(name: str) -> dict[str, Any]:
    """Buggy: the count is not protected against a concurrent change of another doctor's row."""
    shift = _args()[1]
    with _session() as session, session.begin():
        on_call = _off_call(session, name, shift)
    race_point("committed")
    return {"name": name, "on_call_before": on_call}


@bp.post("/doctors/<name>/locked-off-call")
def go_off_call_locked(name: str) -> dict[str, Any]:
    """Control: the doctors on call read ``with_for_update()``; a concurrent request waits and re-checks."""
    shift = _args()[1]
    with _session() as session, session.begin():
        race_point()
        names = session.scalars(select(Doctor.name).where(Doctor.shift == shift, Doctor.on_call)
                                .with_for_update()).all()  # fmt: skip
        if len(names) < 2 or name not in names:
            raise LastOnCall(f"{name} cannot go off call: on call in shift {shift}: {list(names)}")
        doctor = session.get(Doctor, name)
        assert doctor is not None
        doctor.on_call = False
        session.flush()
        race_point("written")
    race_point("committed")
    return {"name": name, "on_call_before": len(names)}


@bp.post("/doctors/<name>/serializable-off-call")
def go_off_call_serializable(name: str) -> dict[str, Any]:
    """Control: the buggy transaction at SERIALIZABLE, retried once after a serialization failure."""
    shift = _args()[1]
    engine: Engine = current_app.extensions["engine"]
    for attempt in (1, 2):
        try:
            with Session(engine.execution_options(isolation_level="SERIALIZABLE")) as session, session.begin():
                try:
                    on_call = _off_call(session, name, shift)
                except LastOnCall as refused:
                    raise LastOnCall(f"{refused} (attempt {attempt})") from None
        except OperationalError as exc:
            if attempt == 2 or not isinstance(exc.orig, SerializationFailure):
                raise
            continue
        race_point("committed")
        return {"name": name, "on_call_before": on_call, "attempts": attempt}
    raise AssertionError("unreachable")


# -- phantom ---------------------------------------------------------------------------------------------------------
@bp.post("/rooms/<int:room>/bookings")
def book(room: int) -> dict[str, Any]:
    """Buggy: "none exists" then ``session.add``, with nothing making the two atomic."""
    _, day, guest = _args()
    with _session() as session, session.begin():
        if session.scalars(select(Booking).where(Booking.room == room, Booking.day == day)).first() is not None:
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        booking = Booking(room=room, day=day, guest=guest)
        session.add(booking)
        session.flush()
        booking_id = booking.booking_id  # (read before the commit expires it)
        race_point("written")
    race_point("committed")
    return {"room": room, "booking_id": booking_id}


@bp.post("/rooms/<int:room>/safe-bookings")
def book_safe(room: int) -> dict[str, Any]:
    """Control: ``UNIQUE (room, day)`` decides; the loser's ``ON CONFLICT DO NOTHING`` returns no row."""
    _, day, guest = _args()
    with _session() as session, session.begin():
        if session.scalars(select(SafeBooking).where(SafeBooking.room == room, SafeBooking.day == day)).first():
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        booking_id = session.scalar(insert(SafeBooking).values(room=room, day=day, guest=guest)
                                    .on_conflict_do_nothing(index_elements=["room", "day"])
                                    .returning(SafeBooking.booking_id))  # fmt: skip
        if booking_id is None:
            raise RoomTaken(f"room {room} was booked on {day} meanwhile")
        race_point("written")
    race_point("committed")
    return {"room": room, "booking_id": booking_id}


@bp.errorhandler(Refused)
def refused(exc: Refused) -> tuple[Response, int]:
    return jsonify(error=f"{type(exc).__name__}: {exc}"), exc.status


@bp.after_request
def trace_id(response: Response) -> Response:
    response.headers[TRACE_HEADER] = current_trace_id()
    return response


def create_app(engine: Engine | None = None) -> Flask:
    app = Flask(STACK)
    app.extensions["engine"] = engine
    app.register_blueprint(bp)
    return app


RULES = {r.endpoint.removeprefix(f"{bp.name}."): r.rule for r in create_app().url_map.iter_rules()}


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
    """The stack running in this process: its app behind its test client, traced to a Collector."""

    app: Flask
    engine: Engine
    provider: TracerProvider

    def send(self, path: str, body: dict[str, Any]) -> Reply:
        response = self.app.test_client().post(path, json=body)
        data = response.get_json(silent=True) or {"error": response.get_data(as_text=True)[:500]}
        return Reply(response.status_code, response.headers.get(TRACE_HEADER, ""), data)

    def shutdown(self) -> None:
        """Export what is still queued; un-instrument; close the pool."""
        try:
            self.provider.shutdown()
        finally:
            FlaskInstrumentor().uninstrument_app(self.app)
            SQLAlchemyInstrumentor().uninstrument()
            self.engine.dispose()


def start(dsn: str, schema: str, otlp_endpoint: str) -> Running:
    """The app on ``dsn`` (tables found through ``search_path=schema``), traced with the stock instrumentations'
    default options, exporting OTLP/HTTP to ``otlp_endpoint``."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"corpus-{STACK}",
                                                        "service.version": "1.0.0"}))  # fmt: skip
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces"),
                                                   schedule_delay_millis=200))  # fmt: skip
    url = dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = create_engine(url, connect_args={"options": f"-c search_path={schema}"}, pool_size=4)
    SQLAlchemyInstrumentor().instrument(engine=engine, tracer_provider=provider)
    app = create_app(engine)
    FlaskInstrumentor().instrument_app(app, tracer_provider=provider)
    return Running(app, engine, provider)
