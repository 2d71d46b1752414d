"""An incident → the production schedule a repro replays: two sessions, their statements and commits in order,
with what each statement returned in production, the seed rows and the columns of the entity's table.

Sessions are the two traces, numbered by their first statement. Debezium's commits are grouped by transaction and
given to the sessions that wrote, in lock order (the first session to write commits first), unless a strong
correlation (trace column, transaction id) names the trace: time-based correlation can attribute two transactions
to one trace. The classes over two rows (write skew, phantom, read skew) take the credited trace whenever it names
one session per transaction: there is no row lock between their writers to order them. A commit is placed at the
middle of its millisecond (``source.ts_ms`` is truncated; ties in log order), never before its session's last
statement; a session that changed no row commits after the sessions whose uncommitted writes one of its writes met.

The seed is every row's earliest image before the incident: the before-image of its first change (none for a row
the incident inserted). Expected results come from replaying the row images along the schedule: a read sees the
committed rows plus its own session's writes; a locking read or a write that meets another session's uncommitted
write waits for that session's commit. A read of several rows (a predicate) is evaluated on the rows known from the
images: its result is known when the WHERE can be evaluated on every one of them and it does not aggregate (but
for a ``count(*)``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from processors.model.anomaly import Anomaly
from processors.model.outputs import AccessInfo, CommitInfo, IncidentEvent
from processors.repro.image_params import recovered
from processors.repro.seed_rows import as_text, image_columns, seed_rows, sql_type_of
from processors.repro.statements import Placeholders, ReproError, Shape, shape, to_psycopg
from processors.sql.values import covers

SUPPORTED = Anomaly.collisions()
MULTI_ROW = (Anomaly.WRITE_SKEW, Anomaly.PHANTOM, Anomaly.READ_SKEW)  # cycles over two rows: the entity is one of them
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
    located_by: str = ""  # how its function was found: code_attributes | stacktrace | route | statement
    candidates: tuple[str, ...] = ()  # the functions it may be, when the code locator could not tell


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
    on_rows: bool = True  # it read or wrote one of the incident's rows (not: a lookup that found none of them)
    relative: tuple[str, ...] = ()  # columns it sets from their own current value (``x = x + 1``)


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
    entities: list[str]  # every row of the incident (two for write skew, phantoms and read skew)


def _db_error(exception: str) -> bool:
    name = exception.rsplit(".", 1)[-1]
    return exception.startswith("psycopg") or name in _DB_ERRORS


def _key(entity: str, table: str, shapes: Sequence[Shape], images: Sequence[dict[str, Any]],
         columns: Sequence[str] | None = None) -> tuple[dict[str, Any], bool]:  # fmt: skip
    """The entity's key (column → typed value) and whether it is a natural identity (``t:col=v``); ``columns``
    names the key columns when they are already known (from the other rows of the incident)."""
    _, _, rest = entity.partition(":")
    parts = rest.split("|")
    labelled = [_LABEL.fullmatch(p) for p in parts]
    if all(labelled):
        wanted = [(m.group(1), m.group(2)) for m in labelled if m]
        identity = True
    elif columns is not None:
        if len(columns) != len(parts):
            raise ReproError(f"{entity} is not named by the key columns {list(columns)} of the incident's rows")
        wanted, identity = list(zip(columns, parts, strict=True)), False
    else:
        identity = False
        wanted = []
        for part in parts:
            column = next((c for s in shapes for c, v in {**s.equals, **s.sets}.items() if as_text(v) == part), None)
            if column is None:
                candidates = [c for img in images for c, v in img.items() if as_text(v) == part]
                column = "id" if "id" in candidates else (candidates[0] if candidates else None)
            if column is None:
                raise ReproError(f"cannot tell which column of {table} holds the key {part!r}")
            wanted.append((column, part))
    key: dict[str, Any] = {}
    for column, text in wanted:
        typed = [v for s in shapes for c, v in {**s.equals, **s.sets}.items() if c == column and as_text(v) == text]
        typed += [img[column] for img in images if column in img and as_text(img[column]) == text]
        key[column] = typed[0] if typed else text
    return key, identity


def _key_columns(entities: Sequence[str], shapes: Sequence[Shape], images: Sequence[dict[str, Any]]) -> list[str]:
    """The columns that name every row of a multi-row incident: per key part, the columns holding that part's
    value in some image of every row; a column a statement names it by (``WHERE name = %s``) first, then ``id``."""
    parts = [e.partition(":")[2].split("|") for e in entities]
    if len({len(p) for p in parts}) != 1:
        raise ReproError(f"the rows {list(entities)} are not named by the same key columns")
    named = {c for s in shapes for c in s.equals}
    columns = []
    for position in range(len(parts[0])):
        common: list[str] | None = None
        for row in parts:
            here = list(dict.fromkeys(c for img in images for c, v in img.items() if as_text(v) == row[position]))
            common = here if common is None else [c for c in common if c in here]
        ranked = sorted(common or [], key=lambda c: (c not in named, c != "id"))
        if not ranked:
            raise ReproError(f"cannot tell which column holds the key of {list(entities)}")
        columns.append(ranked[0])
    return columns


def _transactions(commits: Sequence[CommitInfo]) -> list[list[CommitInfo]]:
    groups: dict[str, list[CommitInfo]] = {}
    for c in sorted(commits, key=lambda c: c.lsn):
        groups.setdefault(c.tx_id or f"lsn{c.lsn}", []).append(c)
    return list(groups.values())


def _assign(commits: Sequence[CommitInfo], sessions: Sequence[SessionInfo], first_write: dict[int, float],
            *, credited: bool) -> dict[int, list[CommitInfo]]:  # fmt: skip
    """Session number → its transaction's row changes (lsn order); ``credited``: take the traces the changes were
    credited to when they name one session per transaction, however weak the correlation."""
    txs = _transactions(commits)
    by_trace = {s.trace_id: s.number for s in sessions}
    named = [{c.trace_id for c in tx} for tx in txs]
    strong = all(c.correlation in _STRONG for tx in txs for c in tx)
    one_each = all(len(t) == 1 and next(iter(t)) in by_trace for t in named) and len(
        {next(iter(t)) for t in named}) == len(txs)  # fmt: skip
    if txs and all(c.trace_id in by_trace for tx in txs for c in tx) and (strong or (credited and one_each)):
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


def _selected(rows: Sequence[dict[str, Any]], sh: Shape) -> list[dict[str, Any]] | None:
    """The rows a statement's WHERE selects among ``rows``; None when that cannot be told for one of them."""
    out = []
    for r in rows:
        found = covers(sh.terms, sh.exact, r)
        if found is None:
            return None
        if found:
            out.append(r)
    return out


def _invariant(incident: IncidentEvent, invariants: Sequence[str] | None) -> str | None:
    """The invariant an invariant violation broke (configured, else the one the incident names); None when it names
    none (the victim failed): the repro then judges by the stale read, see the compiler. Incidents published before
    the detector named it (``invariant`` empty) are read from their damage, the only place they said it."""
    if incident.anomaly != Anomaly.INVARIANT_VIOLATION:
        return None
    if invariants:
        return invariants[0]
    if incident.invariant:
        return incident.invariant
    found = re.search(r"violates (.+?) \(lsn \d+\)", incident.damage)  # (events from before the field only)
    return found.group(1) if found is not None else None


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
    forms: list[Placeholders] = [
        to_psycopg(a.statement, recovered(a, incident.commits), in_order=not a.params) for a in accesses
    ]
    shapes = [shape(f, incident.table) for f in forms]
    images = [img for c in incident.commits for img in (c.before, c.after) if img is not None]
    entities = list(dict.fromkeys([incident.entity, *incident.entities]))
    multi = incident.anomaly in MULTI_ROW and len(entities) > 1
    if multi:
        named_by = _key_columns(entities, shapes, images)
        key, identity = _key(incident.entity, incident.table, shapes, images, named_by)
    else:
        key, identity = _key(incident.entity, incident.table, shapes, images)
    seed = seed_rows(incident.commits, list(key))
    first_write: dict[int, float] = {}
    for a, sh in zip(accesses, shapes, strict=True):
        if sh.kind != "read":
            first_write.setdefault(number[a.trace_id], a.start_unix_ms)
    assigned = _assign(incident.commits, sessions, first_write, credited=multi)
    origin = incident.culprit.start_unix_ms
    in_log_order = sorted(assigned, key=lambda s: min(c.lsn for c in assigned[s]))

    # (time, order, session, access index or None for the commit)
    events: list[tuple[float, int, int, int | None]] = []
    for i, a in enumerate(accesses):
        events.append((a.start_unix_ms, i, number[a.trace_id], i))
    errors = {s.number: _db_error(s.error) if s.error else False for s in sessions}
    ends = _commit_times(sessions, accesses, shapes, assigned, first_write, errors)
    for ending, at in ends.items():
        rank = in_log_order.index(ending) if ending in in_log_order else len(sessions) + ending
        events.append((at, len(accesses) + rank, ending, None))
    events.sort()

    columns = image_columns(incident.commits)
    inserted = {c for sh in shapes for c in sh.inserted}
    steps: list[Step] = []
    state = [dict(r) for r in seed]
    pending: dict[int, list[CommitInfo]] = {s.number: [] for s in sessions}
    queues = {s: list(tx) for s, tx in assigned.items()}
    deferred: dict[int, list[tuple[int, Shape]]] = {s.number: [] for s in sessions}
    rows_of: dict[int, int | None] = {}
    values_of: dict[int, list[Any] | None] = {}
    off_rows: set[int] = set()  # steps that touched none of the incident's rows

    def visible(session: int) -> list[dict[str, Any]]:
        rows = state
        for change in pending[session]:
            rows = _apply(rows, change, key)
        return rows

    def read_result(index: int, session: int, sh: Shape) -> None:
        rows = visible(session) if not multi else _selected(visible(session), sh)
        if multi and rows == []:
            off_rows.add(index)
        if rows is not None and multi and sh.counts:
            rows_of[index], values_of[index] = 1, [len(rows)]
            return
        if rows is None or sh.aggregate:
            rows_of[index], values_of[index] = None, None  # not known from the row images
            return
        rows_of[index] = len(rows)
        values_of[index] = _project(rows[0] if rows else None, sh.columns) if len(rows) <= 1 or not multi else None

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
            if sh.locking and holders and multi:
                rows_of[index], values_of[index] = None, None  # which rows it waits for is not known
            elif sh.locking and holders:
                deferred[session].append((index, sh))
                rows_of[index], values_of[index] = None, None
            else:
                read_result(index, session, sh)
        else:
            queue = queues.get(session, [])
            change = queue.pop(0) if queue and queue[0].op == _OPS[sh.kind] else None
            if change is None:
                rows_of[index], values_of[index] = None, None
                if multi:
                    off_rows.add(index)
            else:
                pending[session].append(change)
                generated = sh.kind == "insert" and any(c not in inserted for c in sh.columns or [])
                rows_of[index] = 1
                values_of[index] = None if generated else _project(change.after, sh.columns)
        steps.append(Step(index, session, sh.kind, a.statement, form.sql, form.params, None, None,
                          "error" if failed else "ok", a.offset_ms, dict(sh.sets),
                          relative=tuple(sh.relative)))  # fmt: skip
    steps = [
        replace(s, rows=rows_of.get(s.index), values=values_of.get(s.index), on_rows=s.index not in off_rows)
        for s in steps
    ]

    derived = []
    for column in columns:
        kind = sql_type_of([img.get(column) for img in images])
        by_database = bool(inserted) and column in key and not identity  # a key the INSERTs leave to the database
        generated = ((identity and column == "id") or by_database) and column not in inserted and kind == "bigint"
        derived.append([column, kind, "identity" if generated else ""])
    return Schedule(incident.anomaly, incident.fingerprint, incident.entity, incident.table, key, identity, seed,
                    derived, sessions, steps, _invariant(incident, invariants),
                    entities if multi else [incident.entity])  # fmt: skip


def _commit_times(sessions: Sequence[SessionInfo], accesses: Sequence[AccessInfo], shapes: Sequence[Shape],
                  assigned: dict[int, list[CommitInfo]], first_write: dict[int, float],
                  errors: dict[int, bool]) -> dict[int, float]:  # fmt: skip
    """When each session commits (none for a session whose last statement failed: it rolled back): a session with
    row changes in the middle of the millisecond of its last one, never before its last statement; a session
    without any right after its last statement, but after every other session that held uncommitted writes when
    one of its writes or locking reads ran (that statement waited for their commit: a guarded UPDATE that then
    matched nothing, an ``INSERT ... ON CONFLICT DO NOTHING`` that met their row)."""
    ends: dict[int, float] = {}
    for s in sessions:
        if errors[s.number]:
            continue  # the session's last statement failed: it rolled back
        last = max(a.start_unix_ms for a in accesses if a.trace_id == s.trace_id)
        tx = assigned.get(s.number)
        ends[s.number] = max(max(c.commit_unix_ms for c in tx) + 0.5, last + 0.001) if tx else last + 0.001
    for s in sessions:
        if assigned.get(s.number) or s.number not in ends:
            continue
        waits = [a.start_unix_ms for a, sh in zip(accesses, shapes, strict=True)
                 if a.trace_id == s.trace_id and (sh.kind != "read" or sh.locking)]  # fmt: skip
        for other, end in list(ends.items()):
            began = first_write.get(other)
            if other == s.number or not assigned.get(other) or began is None:
                continue
            if any(began < at < end for at in waits):
                ends[s.number] = max(ends[s.number], end + 0.001)
    return ends


def _session(number: int, accesses: Sequence[AccessInfo]) -> SessionInfo:
    first = accesses[0]
    error = next((a.exception for a in accesses if a.exception), "")
    return SessionInfo(number, first.trace_id, first.service, first.function, first.file, first.route, error,
                       max(a.http_status for a in accesses), first.located_by, tuple(first.candidates))  # fmt: skip
