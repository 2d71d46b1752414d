"""Template: the SQL-level repro (inlined after the harness templates by the compiler).

Each session replays its recorded statements with their recorded parameters. A session stops, and rolls back,
when a statement returns something other than what production saw: the application decided on that result, so
its recorded continuation no longer applies (a repaired statement that waits for a lock and then sees the new row
ends the session here, as the repaired code would). When the check asks for it (``CHECK["serial"]``), the
statements are also run in each serial order, each on a fresh scratch database, for the stale-read verdict; there
every recorded statement runs (what a serial order returns is what is measured, so nothing stops a session).
"""

from __future__ import annotations

from typing import Any

import psycopg

from processors.repro.template_common import CHECK, SESSIONS, STEPS, DefectReproduced, who
from processors.repro.template_database import Session, prepare, scratch_database
from processors.repro.template_driver import Driver, diverged, fill
from processors.repro.template_serial import serial_orders, serial_steps, stale_effects

LEVEL = "sql"


def replay(driver: Driver, s: Session, *, stop: bool = True) -> None:
    """Run the session's recorded statements, each at its turn (``stop``: until one diverges from production)."""
    cur = s.conn.cursor()
    try:
        for index in s.steps:
            step = STEPS[index]
            driver.gate(s, step["kind"], True)
            if step["kind"] == "commit":
                with driver.statement(s, "commit", "COMMIT", None, index) as record:
                    s.conn.commit()
                driver.after_commit(s, record)
                continue
            with driver.statement(s, step["kind"], step["sql"], step["params"], index) as record:
                cur.execute(step["sql"], step["params"])
                fill(record, cur)
            why = diverged(step, record) if stop else ""
            if why:
                driver.note(f"{who(s.number)} stopped after step {index}: {why}")
                s.conn.rollback()
                return
    except psycopg.Error:
        s.conn.rollback()
        raise


def play(order: list[int] | None) -> tuple[Driver, list[str]]:
    """One run on a fresh scratch database: the recorded interleaving (``order`` None), or a serial order."""
    with scratch_database() as dsn:
        prepare(dsn)
        driver = Driver(dsn)
        sessions = {n: Session(n, psycopg.connect(dsn, autocommit=False)) for n in sorted(SESSIONS)}
        for n, s in sessions.items():
            if SESSIONS[n].get("isolation"):
                s.conn.isolation_level = psycopg.IsolationLevel[str(SESSIONS[n]["isolation"]).upper()]
        try:
            driver.run(sessions, lambda s: replay(driver, s, stop=order is None), order)
            driver.raise_harness_errors((psycopg.Error,))
            problems = driver.problems(driver.snapshot()) if order is None else []
        finally:
            for s in sessions.values():
                s.conn.close()
            driver.close()
            if order is None:
                driver.write_trace(LEVEL)
    return driver, problems


def test_repro(record_property: Any) -> None:
    """The recorded interleaving, replayed statement by statement, shows the production failure."""
    driver, problems = play(None)
    for event in driver.events:
        record_property("event", event)
        print(event)
    if CHECK.get("serial"):
        serial = [(order, play(serial_steps(order))[0]) for order in serial_orders()]
        problems += stale_effects(driver, serial)
    if problems:
        raise DefectReproduced("; ".join(problems))
