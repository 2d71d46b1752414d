"""An incident → the production schedule a repro replays: two sessions, their statements and commits in order,
with what each statement returned in production, the seed rows and the columns of the entity's table.

Sessions are the two traces, numbered by their first statement on the entity. Debezium's commits are grouped by
transaction and given to the sessions that wrote, in lock order (the first session to write commits first), unless
a strong correlation (trace column, transaction id) names the trace: time-based correlation can attribute two
transactions to one trace. A commit is placed at the middle of its millisecond (``source.ts_ms`` is truncated),
never before its session's last statement. Expected results come from replaying the row images along the
schedule: a read sees the committed rows plus its own session's writes; a locking read or a write that meets
another session's uncommitted write waits for that session's commit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from processors.repro.statements import Placeholders, ReproError, Shape, shape, to_psycopg
from streamer.schemas import AccessInfo, CommitInfo, IncidentEvent

SUPPORTED = ("lost_update", "invariant_violation", "duplicate_apply")
_STRONG = ("trace_column", "tx_id")
_OPS = {"write": "u", "insert": "c", "delete": "d"}
_DB_ERRORS = {
    "SerializationFailure", "DeadlockDetected", "UniqueViolation", "LockNotAvailable", "QueryCanceled",
    "CheckViolation", "ForeignKeyViolation", "NotNullViolation", "InFailedSqlTransaction",
}  # fmt: skip
_LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.S)


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One of the two traces, as a database session of the repro."""

    number: int
    trace_id: str
    service: str
    function: str
    file: str
    route: str
    error: str  # the exception the trace ended with, "" if none
    http_status: int


@dataclass(frozen=True, slots=True)
class Step:
    """One statement or commit of the schedule, with what production saw it return."""

    index: int
    session: int
    kind: str  # read | write | insert | delete | commit
    statement: str  # as recorded ("COMMIT" for a commit)
    sql: str  # psycopg form
    params: list[Any] | None
    rows: int | None  # rows returned / affected in production, None when unknown
    values: list[Any] | None  # first row of the selected / returned columns, None when unknown
    outcome: str  # ok | error
    at_ms: float  # from the culprit's conflicting write
    sets: dict[str, Any]  # literal values the statement writes


@dataclass(frozen=True, slots=True)
class Schedule:
    """Everything a generated test needs to know about production."""

    anomaly: str
    fingerprint: str
    entity: str
    table: str
    key: dict[str, Any]
    identity: bool  # the key is a natural identity several rows can share (charges:order_id=7)
    seed: list[dict[str, Any]]
    columns: list[list[str]]  # [name, type, "identity" | ""] for a derived CREATE TABLE
    sessions: list[SessionInfo]
    steps: list[Step]
    invariant: str | None


def _image_columns(commits: Sequence[CommitInfo]) -> list[str]:
    seen: dict[str, None] = {}
    for c in commits:
        for image in (c.before, c.after):
            for column in image or {}:
                seen.setdefault(column, None)
    return list(seen)


def _sql_type(values: Sequence[Any]) -> str:
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            return "boolean"
        if isinstance(v, int):
            return "bigint"
        if isinstance(v, float):
            return "double precision"
        return "text"
    return "text"


def _seed(commits: Sequence[CommitInfo]) -> list[dict[str, Any]]:
    if not commits:
        raise ReproError("no committed row change to seed the row from")
    first = min(commits, key=lambda c: c.lsn)
    if first.before is not None:
        return [dict(first.before)]
    if first.op == "r" and first.after is not None:
        return [dict(first.after)]
    if first.op == "c":
        return []
    raise ReproError("the first row change has no before-image (the table needs REPLICA IDENTITY FULL)")


def _db_error(exception: str) -> bool:
    name = exception.rsplit(".", 1)[-1]
    return exception.startswith("psycopg") or name in _DB_ERRORS


def _key(
    entity: str, table: str, shapes: Sequence[Shape], images: Sequence[dict[str, Any]]
) -> tuple[dict[str, Any], bool]:
    _, _, rest = entity.partition(":")
    parts = rest.split("|")
    labelled = [_LABEL.fullmatch(p) for p in parts]
    if all(labelled):
        wanted = [(m.group(1), m.group(2)) for m in labelled if m]
        identity = True
    else:
        identity = False
        wanted = []
        for part in parts:
            column = next((c for s in shapes for c, v in {**s.equals, **s.sets}.items() if _text(v) == part), None)
            if column is None:
                candidates = [c for img in images for c, v in img.items() if _text(v) == part]
                column = "id" if "id" in candidates else (candidates[0] if candidates else None)
            if column is None:
                raise ReproError(f"cannot tell which column of {table} holds the key {part!r}")
            wanted.append((column, part))
    key: dict[str, Any] = {}
    for column, text in wanted:
        typed = [v for s in shapes for c, v in {**s.equals, **s.sets}.items() if c == column and _text(v) == text]
        typed += [img[column] for img in images if column in img and _text(img[column]) == text]
        key[column] = typed[0] if typed else text
    return key, identity


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _transactions(commits: Sequence[CommitInfo]) -> list[list[CommitInfo]]:
    groups: dict[str, list[CommitInfo]] = {}
    for c in sorted(commits, key=lambda c: c.lsn):
        groups.setdefault(c.tx_id or f"lsn{c.lsn}", []).append(c)
    return list(groups.values())


def _assign(commits: Sequence[CommitInfo], sessions: Sequence[SessionInfo],
            first_write: dict[int, float]) -> dict[int, list[CommitInfo]]:  # fmt: skip
    """Session number → its transaction's row changes (lsn order)."""
    txs = _transactions(commits)
    by_trace = {s.trace_id: s.number for s in sessions}
    if txs and all(c.correlation in _STRONG and c.trace_id in by_trace for tx in txs for c in tx):
        out: dict[int, list[CommitInfo]] = {}
        for tx in txs:
            out.setdefault(by_trace[tx[0].trace_id], []).extend(tx)
        return out
    writers = sorted(first_write, key=lambda s: first_write[s])
    return {s: tx for s, tx in zip(writers, txs, strict=False)}


def _apply(rows: list[dict[str, Any]], change: CommitInfo, key: dict[str, Any]) -> list[dict[str, Any]]:
    out = list(rows)
    if change.op in ("u", "d") and change.before is not None:
        match = next((i for i, r in enumerate(out) if r == change.before), None)
        if match is None:
            match = next((i for i, r in enumerate(out) if all(r.get(k) == change.before.get(k) for k in key)), None)
        if match is not None:
            del out[match]
    if change.op in ("c", "u") and change.after is not None:
        out.append(dict(change.after))
    return out


def _project(row: dict[str, Any] | None, columns: list[str] | None) -> list[Any] | None:
    if row is None or columns is None or any(c not in row for c in columns):
        return None
    return [row[c] for c in columns]


def _invariant(incident: IncidentEvent, invariants: Sequence[str] | None) -> str | None:
    if incident.anomaly != "invariant_violation":
        return None
    if invariants:
        return invariants[0]
    found = re.search(r"violates (.+?) \(lsn \d+\)", incident.damage)
    if found is None:
        raise ReproError("invariant_violation without an invariant: pass invariants=")
    return found.group(1)


def build(incident: IncidentEvent, invariants: Sequence[str] | None = None) -> Schedule:
    """The production schedule of ``incident``; raises ReproError when it cannot be replayed."""
    if incident.anomaly not in SUPPORTED:
        raise ReproError(f"no repro for {incident.anomaly} yet (supported: {', '.join(SUPPORTED)})")
    accesses = sorted(incident.accesses, key=lambda a: a.start_unix_ms)
    traces = list(dict.fromkeys(a.trace_id for a in accesses))
    if len(traces) != 2:
        raise ReproError(f"a repro replays two sessions; the incident has {len(traces)} traces on the entity")
    sessions = [_session(i + 1, [a for a in accesses if a.trace_id == t]) for i, t in enumerate(traces)]
    number = {s.trace_id: s.number for s in sessions}
    forms: list[Placeholders] = [to_psycopg(a.statement, list(a.params)) for a in accesses]
    shapes = [shape(f, incident.table) for f in forms]
    images = [img for c in incident.commits for img in (c.before, c.after) if img is not None]
    key, identity = _key(incident.entity, incident.table, shapes, images)
    seed = _seed(incident.commits)
    first_write: dict[int, float] = {}
    for a, sh in zip(accesses, shapes, strict=True):
        if sh.kind != "read":
            first_write.setdefault(number[a.trace_id], a.start_unix_ms)
    assigned = _assign(incident.commits, sessions, first_write)
    origin = incident.culprit.start_unix_ms

    # (time, order, session, access index or None for the commit)
    events: list[tuple[float, int, int, int | None]] = []
    for i, a in enumerate(accesses):
        events.append((a.start_unix_ms, i, number[a.trace_id], i))
    errors = {s.number: _db_error(s.error) if s.error else False for s in sessions}
    for s in sessions:
        mine = [a for a in accesses if a.trace_id == s.trace_id]
        if errors[s.number]:
            continue  # the session's last statement failed: it rolled back
        last = mine[-1].start_unix_ms
        tx = assigned.get(s.number)
        at = max(max(c.commit_unix_ms for c in tx) + 0.5, last + 0.001) if tx else last + 0.001
        events.append((at, len(accesses) + s.number, s.number, None))
    events.sort()

    columns = _image_columns(incident.commits)
    inserted = {c for sh in shapes for c in sh.inserted}
    steps: list[Step] = []
    state = [dict(r) for r in seed]
    pending: dict[int, list[CommitInfo]] = {s.number: [] for s in sessions}
    queues = {s: list(tx) for s, tx in assigned.items()}
    deferred: dict[int, list[tuple[int, Shape]]] = {s.number: [] for s in sessions}
    rows_of: dict[int, int | None] = {}
    values_of: dict[int, list[Any] | None] = {}

    def visible(session: int) -> list[dict[str, Any]]:
        rows = state
        for change in pending[session]:
            rows = _apply(rows, change, key)
        return rows

    def read_result(index: int, session: int, sh: Shape) -> None:
        rows = visible(session)
        rows_of[index] = len(rows)
        values_of[index] = _project(rows[0] if rows else None, sh.columns)

    for at, _, session, access in events:
        if access is None:
            state = visible(session)
            pending[session] = []
            for other in deferred:
                if other != session:
                    for index, sh in deferred[other]:
                        read_result(index, other, sh)
                    deferred[other] = []
            steps.append(Step(len(steps), session, "commit", "COMMIT", "COMMIT", None, None, None, "ok",
                              round(at - origin, 3), {}))  # fmt: skip
            continue
        a, form, sh = accesses[access], forms[access], shapes[access]
        index = len(steps)
        failed = errors[session] and access == max(i for i, x in enumerate(accesses) if x.trace_id == a.trace_id)
        holders = [o for o, ch in pending.items() if o != session and ch]
        if failed:
            rows_of[index], values_of[index] = None, None
        elif sh.kind == "read":
            if sh.locking and holders:
                deferred[session].append((index, sh))
                rows_of[index], values_of[index] = None, None
            else:
                read_result(index, session, sh)
        else:
            queue = queues.get(session, [])
            change = queue.pop(0) if queue and queue[0].op == _OPS[sh.kind] else None
            if change is None:
                rows_of[index], values_of[index] = None, None
            else:
                pending[session].append(change)
                generated = sh.kind == "insert" and any(c not in inserted for c in sh.columns or [])
                rows_of[index] = 1
                values_of[index] = None if generated else _project(change.after, sh.columns)
        steps.append(Step(index, session, sh.kind, a.statement, form.sql, form.params, None, None,
                          "error" if failed else "ok", a.offset_ms, dict(sh.sets)))  # fmt: skip
    steps = [
        Step(s.index, s.session, s.kind, s.statement, s.sql, s.params, rows_of.get(s.index), values_of.get(s.index),
             s.outcome, s.at_ms, s.sets)
        for s in steps
    ]  # fmt: skip

    derived = []
    for column in columns:
        kind = _sql_type([img.get(column) for img in images])
        generated = identity and column == "id" and column not in inserted and kind == "bigint"
        derived.append([column, kind, "identity" if generated else ""])
    return Schedule(incident.anomaly, incident.fingerprint, incident.entity, incident.table, key, identity, seed,
                    derived, sessions, steps, _invariant(incident, invariants))  # fmt: skip


def _session(number: int, accesses: Sequence[AccessInfo]) -> SessionInfo:
    first = accesses[0]
    error = next((a.exception for a in accesses if a.exception), "")
    return SessionInfo(number, first.trace_id, first.service, first.function, first.file, first.route, error,
                       max(a.http_status for a in accesses))  # fmt: skip
