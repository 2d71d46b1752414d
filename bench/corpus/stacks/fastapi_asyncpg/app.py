"""The corpus's lost update, write skew and phantom as FastAPI endpoints on asyncpg (SQL with ``$1`` placeholders).

Traced by the stock ``opentelemetry-instrumentation-fastapi`` (a SERVER span per request, ``http.route`` the
path template) and ``opentelemetry-instrumentation-asyncpg`` (a CLIENT span per statement, ``BEGIN``/``COMMIT``
included: ``conn.transaction()`` sends them), both with their default options: no parameters, no ``code.*``. Each
request gets a connection of its own (a ``Depends`` dependency; READ COMMITTED, the database's default) and runs one
transaction on it; a refusal is a 409 (an exception handler), and a middleware puts the trace id on the response.

A request goes through the app's ASGI stack in the calling thread (``httpx.ASGITransport`` under ``asyncio.run``:
one event loop per request, so the duel's blocking race points hold only that request), the same middleware and
routing as under a server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
import httpx
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic import BaseModel

from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom, RoomTaken
from bench.corpus.apps.write_skew import LastOnCall, WriteSkew
from bench.corpus.race import race_point
from bench.corpus.scenario import BUG, RoundPlan, Scenario
from bench.corpus.service import Refused
from bench.corpus.stacks.web import TRACE_HEADER, Reply, View, all_plans, current_trace_id

STACK = "fastapi_asyncpg"
OFFSET = 300  # this stack's rounds are numbered from 301
router = APIRouter()


class Args(BaseModel):
    args: list[Any]  # the round's arguments (the first is the path's key)


async def connection(request: Request) -> AsyncIterator[asyncpg.Connection]:
    """A connection of the request's own (closed when it is answered)."""
    conn = await asyncpg.connect(request.app.state.dsn, server_settings={"search_path": request.app.state.schema})
    try:
        yield conn
    finally:
        await conn.close()


Conn = asyncpg.Connection
Db = Annotated[asyncpg.Connection, Depends(connection)]

READ = "SELECT balance FROM corpus_accounts WHERE account_no = $1"
WRITE = "UPDATE corpus_accounts SET balance = $1 WHERE account_no = $2"
ADD = "UPDATE corpus_accounts SET balance = balance + $1 WHERE account_no = $2"
COUNT = "SELECT count(*) FROM corpus_doctors WHERE shift = $1 AND on_call"
LOCK = "SELECT name FROM corpus_doctors WHERE shift = $1 AND on_call FOR UPDATE"
OFF = "UPDATE corpus_doctors SET on_call = false WHERE name = $1"
FIND = "SELECT booking_id FROM corpus_bookings WHERE room = $1 AND day = $2"
INSERT = "INSERT INTO corpus_bookings (room, day, guest) VALUES ($1, $2, $3) RETURNING booking_id"
FIND_SAFE = "SELECT booking_id FROM corpus_bookings_safe WHERE room = $1 AND day = $2"
INSERT_SAFE = ("INSERT INTO corpus_bookings_safe (room, day, guest) VALUES ($1, $2, $3)"
               " ON CONFLICT (room, day) DO NOTHING RETURNING booking_id")  # fmt: skip


# -- lost update -----------------------------------------------------------------------------------------------------
async def _balance(conn: Conn, query: str, account_no: str) -> int:
    balance = await conn.fetchval(query, account_no)
    if balance is None:
        raise Refused(f"no account {account_no}")
    return int(balance)


@router.post("/accounts/{account_no}/deposits")
async def deposit(account_no: str, body: Args, conn: Db) -> dict[str, Any]:
    """Buggy: unlocked read, the new balance computed here, written back unconditionally."""
    amount = body.args[1]
    async with conn.transaction():
        balance = await _balance(conn, READ, account_no)
        race_point()
        await conn.execute(WRITE, balance + amount, account_no)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": balance + amount}


@router.post("/accounts/{account_no}/locked-deposits")
async def deposit_locked(account_no: str, body: Args, conn: Db) -> dict[str, Any]:
    """Control: the read takes the row lock (``FOR UPDATE``), so a concurrent deposit waits and reads our result."""
    amount = body.args[1]
    async with conn.transaction():
        race_point()
        balance = await _balance(conn, READ + " FOR UPDATE", account_no)
        await conn.execute(WRITE, balance + amount, account_no)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no, "balance": balance + amount}


@router.post("/accounts/{account_no}/atomic-deposits")
async def deposit_atomic(account_no: str, body: Args, conn: Db) -> dict[str, Any]:
    """Control: the same unlocked read, but the write is relative (``balance = balance + $1``)."""
    amount = body.args[1]
    async with conn.transaction():
        await _balance(conn, READ, account_no)
        race_point()
        await conn.execute(ADD, amount, account_no)
        race_point("written")
    race_point("committed")
    return {"account_no": account_no}


# -- write skew ------------------------------------------------------------------------------------------------------
async def _off_call(conn: Conn, name: str, shift: int, attempt: int = 1) -> int:
    on_call = int(await conn.fetchval(COUNT, shift) or 0)
    if on_call < 2:
        raise LastOnCall(f"{name} is the last doctor on call in shift {shift} (attempt {attempt})")
    race_point()
    await conn.execute(OFF, name)
    race_point("written")
    return on_call


@router.post("/doctors/{name}/off-call")
async def go_off_call(name: str, body: Args, conn: Db) -> dict[str, Any]:
    """Buggy: the count is not protected against a concurrent change of another doctor's row."""
    shift = body.args[1]
    async with conn.transaction():
        on_call = await _off_call(conn, name, shift)
    race_point("committed")
    return {"name": name, "on_call_before": on_call}


@router.post("/doctors/{name}/locked-off-call")
async def go_off_call_locked(name: str, body: Args, conn: Db) -> dict[str, Any]:
    """Control: the doctors on call are read with ``FOR UPDATE``; a concurrent request waits and re-checks."""
    shift = body.args[1]
    async with conn.transaction():
        race_point()
        names = [r[0] for r in await conn.fetch(LOCK, shift)]
        if len(names) < 2 or name not in names:
            raise LastOnCall(f"{name} cannot go off call: on call in shift {shift}: {names}")
        await conn.execute(OFF, name)
        race_point("written")
    race_point("committed")
    return {"name": name, "on_call_before": len(names)}


@router.post("/doctors/{name}/serializable-off-call")
async def go_off_call_serializable(name: str, body: Args, conn: Db) -> dict[str, Any]:
    """Control: the buggy transaction at SERIALIZABLE, retried once after a serialization failure."""
    shift = body.args[1]
    for attempt in (1, 2):
        try:
            async with conn.transaction(isolation="serializable"):
                on_call = await _off_call(conn, name, shift, attempt)
        except asyncpg.SerializationError:
            if attempt == 2:
                raise
            continue
        race_point("committed")
        return {"name": name, "on_call_before": on_call, "attempts": attempt}
    raise AssertionError("unreachable")


# -- phantom ---------------------------------------------------------------------------------------------------------
@router.post("/rooms/{room}/bookings")
async def book(room: int, body: Args, conn: Db) -> dict[str, Any]:
    """Buggy: check-then-insert with nothing that makes the check and the insert atomic."""
    _, day, guest = body.args
    async with conn.transaction():
        if await conn.fetchval(FIND, room, day) is not None:
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        booking_id = await conn.fetchval(INSERT, room, day, guest)
        race_point("written")
    race_point("committed")
    return {"room": room, "booking_id": booking_id}


@router.post("/rooms/{room}/safe-bookings")
async def book_safe(room: int, body: Args, conn: Db) -> dict[str, Any]:
    """Control: the unique constraint decides; the loser's ``ON CONFLICT DO NOTHING`` returns no row."""
    _, day, guest = body.args
    async with conn.transaction():
        if await conn.fetchval(FIND_SAFE, room, day) is not None:
            raise RoomTaken(f"room {room} is booked on {day}")
        race_point()
        booking_id = await conn.fetchval(INSERT_SAFE, room, day, guest)
        if booking_id is None:
            raise RoomTaken(f"room {room} was booked on {day} meanwhile")
        race_point("written")
    race_point("committed")
    return {"room": room, "booking_id": booking_id}


def create_app(dsn: str = "", schema: str = "public") -> FastAPI:
    app = FastAPI()
    app.state.dsn, app.state.schema = dsn, schema
    app.include_router(router)

    @app.exception_handler(Refused)
    async def refused(request: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=exc.status)

    @app.middleware("http")
    async def trace_id(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers[TRACE_HEADER] = current_trace_id()
        return response

    return app


RULES = {r.name: r.path for r in router.routes if isinstance(r, APIRoute)}


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
    """The app in this process, called through its ASGI stack, traced to a Collector."""

    app: FastAPI
    provider: TracerProvider

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await client.post(path, json=body)

    def send(self, path: str, body: dict[str, Any]) -> Reply:
        response = asyncio.run(self._post(path, body))
        try:
            data = response.json()
        except ValueError:
            data = {"error": response.text[:500]}
        return Reply(response.status_code, response.headers.get(TRACE_HEADER, ""), data)

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        finally:
            FastAPIInstrumentor.uninstrument_app(self.app)
            AsyncPGInstrumentor().uninstrument()


def start(dsn: str, schema: str, otlp_endpoint: str) -> Running:
    """The app on ``dsn`` (tables found through ``search_path=schema``), traced by the stock FastAPI and asyncpg
    instrumentations with default options, exporting OTLP/HTTP to ``otlp_endpoint``."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"corpus-{STACK}",
                                                        "service.version": "1.0.0"}))  # fmt: skip
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{otlp_endpoint.rstrip('/')}/v1/traces"),
                                                   schedule_delay_millis=200))  # fmt: skip
    AsyncPGInstrumentor().instrument(tracer_provider=provider)
    app = create_app(dsn, schema)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    return Running(app, provider)
