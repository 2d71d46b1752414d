"""Template: the driver that replays the recorded interleaving, and the verdict on the final rows.

Inlined by the compiler after ``template_database``. A ``Driver`` hands out the recorded steps one at a time: each
session waits at a gate for its turn, runs its statement, and parks at its next gate; the driver moves on when
every session is parked, finished, or observed waiting on a lock (``pg_stat_activity``, polled from a third
connection while a statement runs; that wait is recorded). A session that waits on a lock has its later steps held
back until it gets the lock. Nothing sleeps to order anything. The verdict (``Driver.problems``) judges the real
final rows and the sessions' errors against the recorded anomaly, never a recorded verdict. A statement that runs
into the scratch role's ``statement_timeout`` or ``lock_timeout`` ends the run with a ``HarnessError`` naming it:
such a run proves nothing either way.
The serial orders the interleaving is judged against are in ``template_serial``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from processors.repro.template_common import (
    ANOMALY,
    CHECK,
    ENTITY,
    FINGERPRINT,
    KEY,
    POLL_S,
    SEED,
    STATEMENT_TIMEOUT_MS,
    STEP_TIMEOUT_S,
    STEPS,
    TABLE,
    TRACE_OUT,
    HarnessError,
    norm,
    normalise,
    who,
)
from processors.repro.template_database import Session, _key_filter


class Driver:
    """Hands out the recorded steps in order; see the module docstring."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.cond = threading.Condition()
        self.local = threading.local()
        self.sessions: dict[int, Session] = {}
        self.records: list[dict[str, Any]] = []
        self.events: list[str] = []
        self.issued = 0
        self.completed = 0
        self.timeouts: list[str] = []  # statements the sandbox's timeout ended: the run proves nothing
        self.observer = psycopg.connect(dsn, autocommit=True)
        self.observer_lock = threading.Lock()

    def current(self) -> Session | None:
        session: Session | None = getattr(self.local, "session", None)
        return session

    def note(self, event: str) -> None:
        with self.cond:
            self.events.append(event)

    # ---- the session side --------------------------------------------------------------------------------------
    def gate(self, s: Session, kind: str, on_table: bool) -> int | None:
        """Wait for the turn of the session's next recorded step if this statement is it; returns its index."""
        with self.cond:
            step: int | None = None
            if on_table and s.consumed < len(s.steps) and STEPS[s.steps[s.consumed]]["kind"] == kind:
                step = s.steps[s.consumed]
                s.consumed += 1
                need = s.consumed
            else:  # not a recorded step: it runs within the session's current turn (freely before its first one,
                need = s.consumed  # like the check-reads production ran before the interleaving began)
            deadline = time.monotonic() + STEP_TIMEOUT_S
            while s.granted < need:
                s.state = "parked"
                self.cond.notify_all()
                if not self.cond.wait(max(0.0, deadline - time.monotonic())):
                    raise HarnessError(f"{who(s.number)} never got its turn for step {step}")
            s.state = "running"
            return step

    @contextmanager
    def statement(self, s: Session, kind: str, text: str, params: Any, step: int | None,
                  on_table: bool = True) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Record one statement around its execution (outcome, rows, and any lock wait)."""
        with self.cond:
            self.issued += 1
            record: dict[str, Any] = {
                "session": s.number, "step": step, "kind": kind, "statement": normalise(text),
                "params": norm(params), "rows": None, "values": None, "result": None, "outcome": "blocked",
                "waited_on": None, "error": "", "on_table": on_table, "issued": self.issued, "done": None,
            }  # fmt: skip
            self.records.append(record)
            s.inflight, s.blocked_by = record, None
        try:
            yield record
            record["outcome"] = "ok"
        except psycopg.Error as exc:
            record["outcome"] = "error"
            record["error"] = f"{type(exc).__name__}: {exc}".strip()
            if timed_out(exc, text):
                message = (f"{who(s.number)} step {step} ran into the repro's statement/lock timeout "
                           f"({STATEMENT_TIMEOUT_MS} ms): {record['error']}: {record['statement']}")  # fmt: skip
                with self.cond:
                    self.timeouts.append(message)
                    self.events.append(message)
                raise HarnessError(message) from exc
            raise
        finally:
            with self.cond:
                s.inflight, s.blocked_by = None, None
                self.completed += 1
                record["done"] = self.completed
                self.cond.notify_all()

    def after_commit(self, s: Session, record: dict[str, Any]) -> None:
        record["snapshot"] = self.snapshot()

    # ---- the driver side ---------------------------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        """The entity's committed rows, seen from the observer connection."""
        query = sql.SQL("SELECT * FROM {} WHERE {}").format(sql.Identifier(TABLE), _key_filter())
        with self.observer_lock, self.observer.cursor(row_factory=dict_row) as cur:
            rows = [norm(r) for r in cur.execute(query, list(KEY.values())).fetchall()]
        return sorted(rows, key=repr)

    def _lock_waits(self, running: list[Session]) -> dict[int, int]:
        """Session → the session (0: another backend) holding the lock it waits for."""
        pids = {s.pid: s.number for s in self.sessions.values()}
        with self.observer_lock:
            rows = self.observer.execute(
                "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity WHERE pid = ANY(%s)"
                " AND wait_event_type = 'Lock'",
                ([s.pid for s in running],),
            ).fetchall()
        return {pids[pid]: next((pids[b] for b in blockers if b in pids), 0) for pid, blockers in rows}

    def settle(self) -> None:
        """Wait until every session is parked, done, or waiting on a lock (that wait is recorded)."""
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while True:
            with self.cond:
                running = [s for s in self.sessions.values() if s.state == "running" and s.blocked_by is None]
                inflight = {s.number: s.inflight for s in running}
            if not running:
                return
            waits = self._lock_waits([s for s in running if inflight[s.number] is not None])
            with self.cond:
                for s in running:
                    record = inflight[s.number]
                    if s.number in waits and record is not None and s.inflight is record:
                        s.blocked_by = waits[s.number]
                        record["waited_on"] = s.blocked_by
                        holder = who(s.blocked_by) if s.blocked_by else "another backend"
                        self.events.append(f"{who(s.number)} waited on a lock held by {holder}: {record['statement']}")
                if all(s.state != "running" or s.blocked_by is not None for s in self.sessions.values()):
                    return
                if time.monotonic() > deadline:
                    raise HarnessError("the schedule is stuck: " + ", ".join(
                        f"{who(s.number)} {s.state}" for s in self.sessions.values()))  # fmt: skip
                self.cond.wait(POLL_S)

    def run(self, sessions: dict[int, Session], body: Callable[[Session], Any], order: list[int] | None = None) -> None:
        """Start one thread per session and hand out every step in the recorded order (or in ``order``, one step
        at a time: a serial run)."""
        self.sessions = sessions
        with self.cond:  # a session counts as running until it parks at its first recorded step
            for s in sessions.values():
                s.state = "running"
        threads = [threading.Thread(target=self._thread, args=(s, body), name=f"repro-session-{n}", daemon=True)
                   for n, s in sessions.items()]  # fmt: skip
        for t in threads:
            t.start()
        pending = list(range(len(STEPS))) if order is None else list(order)
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while pending:
            self.settle()
            with self.cond:
                chosen = None
                for index in list(pending):
                    s = sessions[STEPS[index]["session"]]
                    if s.state == "done":
                        pending.remove(index)  # the session ended before this step
                    elif s.state != "running":  # a session waiting on a lock keeps its later steps
                        chosen = index
                        break
                    elif order is not None:
                        break  # serial: nothing overtakes the next step
                if chosen is None:
                    if pending and time.monotonic() > deadline:
                        raise HarnessError("every remaining step waits on a lock")
                    self.cond.wait(POLL_S)
                    continue
                pending.remove(chosen)
                s = sessions[STEPS[chosen]["session"]]
                s.granted += 1
                s.state = "running"
                deadline = time.monotonic() + STEP_TIMEOUT_S
                self.cond.notify_all()
        self.settle()
        for t in threads:
            t.join(STEP_TIMEOUT_S)
            if t.is_alive():
                raise HarnessError(f"{t.name} did not finish")

    def _thread(self, s: Session, body: Callable[[Session], Any]) -> None:
        self.local.session = s
        try:
            s.result = body(s)
        except BaseException as exc:  # the session's outcome, judged by the test
            s.error = exc
        finally:
            with self.cond:
                s.state = "done"
                self.cond.notify_all()

    def close(self) -> None:
        self.observer.close()

    def raise_harness_errors(self, outcomes: tuple[type[BaseException], ...]) -> None:
        """Re-raise a session's exception unless it is one of the outcomes the test judges (a statement that ran
        into the timeout is never one, even if the code around it swallowed the error)."""
        if self.timeouts:
            raise HarnessError("; ".join(self.timeouts))
        for s in self.sessions.values():
            if s.error is not None and (isinstance(s.error, HarnessError) or not isinstance(s.error, outcomes)):
                raise s.error

    # ---- the verdict -------------------------------------------------------------------------------------------
    def problems(self, final: list[dict[str, Any]]) -> list[str]:
        """The production failure, if it happened again: the anomaly in the final rows, or a recorded error."""
        found: list[str] = []
        if ANOMALY == "lost_update":
            found += self._lost(final)
        elif ANOMALY == "invariant_violation" and "invariant_sql" in CHECK:
            found += self._broken()
        elif ANOMALY == "duplicate_apply" and len(final) > max(1, len(SEED)):
            found.append(f"duplicate apply on {ENTITY}: {len(final)} rows for one {KEY} (was {len(SEED)}): {final}")
        recorded = {str(name).rsplit(".", 1)[-1]: int(n) for n, name in CHECK.get("failures", {}).items()}
        for s in self.sessions.values():  # code after the last recorded step is not scheduled: either may fail
            name = type(s.error).__name__ if s.error is not None else ""
            if name in recorded:
                was = "" if recorded[name] == s.number else f" (in production: {who(recorded[name])})"
                found.append(f"{who(s.number)} failed as in production{was}: {name}: {s.error}")
        return found

    def _lost(self, final: list[dict[str, Any]]) -> list[str]:
        """A value one commit wrote that is gone from the final row, overwritten by a later commit whose session
        read nothing after it; a value the later session's relative write (``x = x + 1``) ran on is kept."""
        commits = sorted((r for r in self.records if r["kind"] == "commit" and r["outcome"] == "ok"
                          and "snapshot" in r), key=lambda r: r["done"])  # fmt: skip
        before = norm(SEED)
        changes: list[tuple[dict[str, Any], dict[str, Any]]] = []
        for commit in commits:
            old, new = (before[0] if before else {}), (commit["snapshot"][0] if commit["snapshot"] else {})
            columns = CHECK.get("columns") or list(new)
            written = {c: new.get(c) for c in columns if new.get(c) != old.get(c)}
            if written:
                changes.append((commit, written))
            before = commit["snapshot"]
        row = final[0] if final else {}
        relative = CHECK.get("relative", {})
        found = []
        for i, (commit, written) in enumerate(changes):
            for later, _ in changes[i + 1 :]:
                mine = [r for r in self.records if r["session"] == later["session"] and r["on_table"]
                        and r["outcome"] == "ok" and ran_after(r, commit)]  # fmt: skip
                saw = any(r["kind"] == "read" for r in mine)
                kept = {c for r in mine if r["kind"] == "write" and r["rows"] for c in relative.get(r["step"], ())}
                gone = {c: v for c, v in written.items() if row.get(c) != v and c not in kept}
                if gone and not saw:
                    shown = ", ".join(f"{c} = {v!r}" for c, v in gone.items())
                    now = ", ".join(f"{c} = {row.get(c)!r}" for c in gone)
                    found.append(f"lost update on {ENTITY}: {shown} committed by {who(commit['session'])} is gone "
                                 f"from the final row ({now}); {who(later['session'])} overwrote it without "
                                 "reading it")  # fmt: skip
        return found

    def _broken(self) -> list[str]:
        predicate = sql.SQL(CHECK["invariant_sql"])
        query = sql.SQL("SELECT ({}) IS NOT TRUE, * FROM {} WHERE {}").format(
            predicate, sql.Identifier(TABLE), _key_filter()
        )
        with self.observer_lock, self.observer.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(query, list(KEY.values())).fetchall()
        found = []
        for row in rows:
            broken = row.pop("?column?")
            if broken:
                found.append(f"invariant {CHECK['invariant']} broken on {ENTITY}: final row {norm(row)}")
        return found

    def write_trace(self, level: str) -> None:
        """The executed statements, in the order they were issued, for the first-divergence check."""
        if not TRACE_OUT:
            return
        fields = ("session", "step", "kind", "statement", "params", "rows", "values", "outcome", "waited_on", "error",
                  "on_table")  # fmt: skip
        statements = [{f: r[f] for f in fields} for r in sorted(self.records, key=lambda r: r["issued"])]
        trace = {"fingerprint": FINGERPRINT, "level": level, "statements": statements, "events": self.events}
        with open(TRACE_OUT, "w", encoding="utf-8") as out:
            json.dump(trace, out, indent=1, default=str)


def timed_out(exc: psycopg.Error, text: str) -> bool:
    """Whether the sandbox's ``statement_timeout`` or ``lock_timeout`` ended the statement (a ``NOWAIT`` lock
    failure is the statement's own outcome)."""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return True
    return isinstance(exc, psycopg.errors.LockNotAvailable) and "nowait" not in text.lower()


def fill(record: dict[str, Any], cur: psycopg.Cursor[Any], *, rewind: bool = False) -> None:
    """Rows affected or returned, the first returned row, and every returned row in a stable order (the cursor is
    rewound for the caller)."""
    record["rows"] = cur.rowcount if cur.rowcount >= 0 else None
    if cur.description is not None:
        rows = [norm(list(row.values()) if isinstance(row, dict) else list(row)) for row in cur.fetchall()]
        record["result"] = sorted(rows, key=repr)
        if rows:
            record["values"] = rows[0]
            if rewind:
                cur.scroll(0, "absolute")


WRITES = ("write", "insert", "delete")


def ran_after(record: dict[str, Any], commit: dict[str, Any]) -> bool:
    """Whether a statement saw what ``commit`` committed: it completed after it, or it waited on the committing
    session's lock (then it went on only once that transaction had ended, whichever thread got noted first)."""
    if record["done"] is None:
        return False
    return bool(record["done"] > commit["done"] or record["waited_on"] == commit["session"])


def n_rows(n: int | None) -> str:
    return "? rows" if n is None else f"{n} row" if n == 1 else f"{n} rows"


def diverged(step: dict[str, Any], record: dict[str, Any]) -> str:
    """Why a statement's result is not the one production saw ("" when it is)."""
    if step["rows"] is not None and record["rows"] != step["rows"]:
        return f"{record['rows']} rows where production had {step['rows']}"
    if step["values"] is not None and record["values"] is not None and record["values"] != step["values"]:
        return f"returned {record['values']} where production read {step['values']}"
    return ""
