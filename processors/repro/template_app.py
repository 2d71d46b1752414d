"""Template: the application-level repro (inlined after the harness templates by the compiler).

The recorded functions are imported from the service's source tree (``REPRO_SOURCE_ROOT``, default: where they
were recorded) and called in two threads with the recorded arguments, each with its own connection to the scratch
database (a method on an instance built with no arguments or with that connection; a coroutine function run to
completion in its thread). ``psycopg.Cursor.execute`` and the transaction's COMMIT are patched so that every
statement passes the driver's gate: a statement on the entity's table of the kind the session's next recorded step
has *is* that step and waits for its turn; any other statement runs within the session's current turn. When the
check asks for it (``CHECK["serial"]``), the functions are also run one after the other, in each order, each on a
fresh scratch database, for the stale-read verdict (those runs' own exceptions are not the verdict).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import re
import sys
from typing import Any
from urllib.parse import quote

import psycopg
import pytest

from processors.repro.template_common import CHECK, SESSIONS, TABLE, DefectReproduced
from processors.repro.template_database import Session, prepare, scratch_database
from processors.repro.template_driver import Driver, fill
from processors.repro.template_serial import serial_orders, serial_steps, stale_effects

LEVEL = "app"
# ---- recorded in production (generated data) ------------------------------------------------------------------
RECORDED_SOURCE_ROOT: str = ""
CALLS: dict[int, dict[str, Any]] = {}
# ---- end of recorded data -------------------------------------------------------------------------------------

ON_TABLE = re.compile(r"\b(?:from|update|into|join)\s+(?:\"?[\w$]+\"?\.)?\"?" + re.escape(TABLE) + r"\"?(?![\w$])",
                      re.IGNORECASE)  # fmt: skip
KINDS = {"select": "read", "update": "write", "insert": "insert", "delete": "delete"}


def source_root() -> str:
    return os.environ.get("REPRO_SOURCE_ROOT") or RECORDED_SOURCE_ROOT


def load(target: str) -> Any:
    """``package.module:function`` from the source root."""
    root = source_root()
    if root not in sys.path:
        sys.path.insert(0, root)
    module, _, name = target.partition(":")
    found: Any = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def request(call: dict[str, Any], session: Session, dsn: str) -> Any:
    """A web view, requested through its framework's test client (its decorators and the app's hooks run as in
    production) on an app its factory builds on the scratch database; the view's exception propagates. The app's
    connections are the session's: the driver watches the lock waits of the last one opened."""
    method, rule = call["http"]
    factory, takes = call["factory"]

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(dsn)
        session.pid = conn.info.backend_pid
        return conn

    given: Any = dsn
    if takes == "engine":
        import sqlalchemy  # (only a view's repro needs it)

        given = sqlalchemy.create_engine("postgresql+psycopg://", creator=connect, poolclass=sqlalchemy.pool.NullPool)
    app = load(factory)(given)
    app.testing = True
    path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", lambda m: quote(str(call["kwargs"][m.group(1)]), safe=""), rule)
    response = app.test_client().open(path, method=method)
    return response.status_code, response.get_json(silent=True)


def invoke(function: Any, call: dict[str, Any], session: Session, dsn: str) -> Any:
    """One recorded call: on an instance of the method's class when it needs one, run to completion when it is a
    coroutine function (in this session's thread, on a loop of its own), or a request to a web view."""
    if call.get("http"):
        return request(call, session, dsn)
    conn = session.conn
    args = [conn, *call["args"]]
    if call.get("receiver"):
        owner, _, method = call["target"].partition(":")[2].rpartition(".")
        cls = load(call["target"].partition(":")[0] + ":" + owner)
        function = getattr(cls(conn) if call["receiver"] == "connection" else cls(), method)
        args = args[1:] if call["receiver"] == "connection" else args
    result = function(*args, **call["kwargs"])
    return asyncio.run(result) if call.get("coroutine") else result


def classify(text: str) -> tuple[str, bool]:
    """(kind, whether it names the entity's table)."""
    words = text.lstrip(" \t\r\n(").split(None, 1)
    return KINDS.get(words[0].lower() if words else "", "other"), bool(ON_TABLE.search(text))


def install(monkeypatch: pytest.MonkeyPatch, driver: Driver) -> None:
    """Route every statement and commit of the session threads through the driver's gate."""
    execute, leave, commit = psycopg.Cursor.execute, psycopg.Transaction.__exit__, psycopg.Connection.commit

    def gated_execute(cur: psycopg.Cursor[Any], query: Any, params: Any = None, **kwargs: Any) -> Any:
        s = driver.current()
        if s is None or cur.connection is driver.observer:  # not a session thread, or the harness's own query
            return execute(cur, query, params, **kwargs)
        text = query if isinstance(query, str) else query.decode() if isinstance(query, bytes) else query.as_string(cur)
        kind, on_table = classify(text)
        step = driver.gate(s, kind, on_table)
        with driver.statement(s, kind, text, params, step, on_table) as record:
            result = execute(cur, query, params, **kwargs)
            fill(record, cur, rewind=True)
        return result

    def gated_commit(s: Session, run: Any) -> Any:
        step = driver.gate(s, "commit", True)
        with driver.statement(s, "commit", "COMMIT", None, step) as record:
            result = run()
        driver.after_commit(s, record)
        return result

    def gated_exit(tx: psycopg.Transaction, exc_type: Any, exc: Any, tb: Any) -> Any:
        s = driver.current()
        if s is None or tx.savepoint_name:  # not a session thread, or a nested block (a savepoint)
            return leave(tx, exc_type, exc, tb)
        if exc_type is not None:  # the application's own rollback: recorded, not scheduled
            with driver.statement(s, "rollback", "ROLLBACK", None, None):
                return leave(tx, exc_type, exc, tb)
        return gated_commit(s, lambda: leave(tx, exc_type, exc, tb))

    def gated_connection_commit(conn: psycopg.Connection[Any]) -> None:
        s = driver.current()
        if s is None:
            commit(conn)
        else:
            gated_commit(s, lambda: commit(conn))

    monkeypatch.setattr(psycopg.Cursor, "execute", gated_execute)
    monkeypatch.setattr(psycopg.Transaction, "__exit__", gated_exit)
    monkeypatch.setattr(psycopg.Connection, "commit", gated_connection_commit)


def play(monkeypatch: pytest.MonkeyPatch, order: list[int] | None) -> tuple[Driver, dict[int, Session], list[str]]:
    """One run on a fresh scratch database: the recorded interleaving (``order`` None), or a serial order."""
    functions = {n: load(CALLS[n]["target"]) for n in sorted(SESSIONS)}
    with scratch_database() as dsn:
        prepare(dsn)
        driver = Driver(dsn)
        sessions = {n: Session(n, psycopg.connect(dsn, autocommit=bool(CALLS[n].get("autocommit", True))))
                    for n in sorted(SESSIONS)}  # fmt: skip
        try:
            install(monkeypatch, driver)
            driver.run(sessions, lambda s: invoke(functions[s.number], CALLS[s.number], s, dsn), order)
            monkeypatch.undo()
            driver.raise_harness_errors((Exception,))
            problems = driver.problems(driver.snapshot()) if order is None else []
        finally:
            monkeypatch.undo()
            for s in sessions.values():
                s.conn.close()
            driver.close()
            if order is None:
                driver.write_trace(LEVEL)
    return driver, sessions, problems


def test_repro(monkeypatch: pytest.MonkeyPatch, record_property: Any) -> None:
    """The recorded functions, run in the recorded interleaving, show the production failure."""
    driver, sessions, problems = play(monkeypatch, None)
    for event in driver.events:
        record_property("event", event)
        print(event)
    for n, s in sessions.items():
        outcome = f"raised {type(s.error).__name__}: {s.error}" if s.error else f"returned {s.result!r}"
        record_property(f"session {n}", outcome)
    if CHECK.get("serial"):
        serial = [(order, play(monkeypatch, serial_steps(order))[0]) for order in serial_orders()]
        problems += stale_effects(driver, serial)
    if problems:
        raise DefectReproduced("; ".join(problems))
