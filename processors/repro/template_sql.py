"""Template: the SQL-level repro (inlined after ``template_common`` by the compiler).

Each session replays its recorded statements with their recorded parameters. A session stops, and rolls back,
when a statement returns something other than what production saw: the application decided on that result, so
its recorded continuation no longer applies (a repaired statement that waits for a lock and then sees the new row
ends the session here, as the repaired code would).
"""

from __future__ import annotations

from typing import Any

import psycopg

from processors.repro.template_common import (
    SESSIONS,
    STEPS,
    DefectReproduced,
    Driver,
    Session,
    diverged,
    fill,
    prepare,
    scratch_database,
    who,
)

LEVEL = "sql"


def replay(driver: Driver, s: Session) -> None:
    """Run the session's recorded statements, each at its turn."""
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
            why = diverged(step, record)
            if why:
                driver.note(f"{who(s.number)} stopped after step {index}: {why}")
                s.conn.rollback()
                return
    except psycopg.Error:
        s.conn.rollback()
        raise


def test_repro(record_property: Any) -> None:
    """The recorded interleaving, replayed statement by statement, shows the production failure."""
    with scratch_database() as dsn:
        prepare(dsn)
        driver = Driver(dsn)
        sessions = {n: Session(n, psycopg.connect(dsn, autocommit=False)) for n in sorted(SESSIONS)}
        for n, s in sessions.items():
            if SESSIONS[n].get("isolation"):
                s.conn.isolation_level = psycopg.IsolationLevel[str(SESSIONS[n]["isolation"]).upper()]
        try:
            driver.run(sessions, lambda s: replay(driver, s))
            driver.raise_harness_errors((psycopg.Error,))
            problems = driver.problems(driver.snapshot())
        finally:
            for s in sessions.values():
                s.conn.close()
            driver.close()
            driver.write_trace(LEVEL)
        for event in driver.events:
            record_property("event", event)
            print(event)
        if problems:
            raise DefectReproduced("; ".join(problems))
