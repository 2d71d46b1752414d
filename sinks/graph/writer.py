"""The FalkorDB graph writer: schema bootstrap, batched idempotent upserts, retries, retention.

Every statement is ``UNWIND $rows AS r MERGE ...`` on an indexed key, so replaying input changes nothing.
Indexes and unique constraints are created before the first write and polled until OPERATIONAL (FalkorDB builds
them in the background, and MERGE on an unindexed label scans the whole label per row).

**Failures** are classified by :func:`classify` from the exception's type and text (:data:`RULES`, the first rule
that matches wins):

======================================================================  =========  =================================
error: a redis-py type, or the text of a ``ResponseError``              handling   why
======================================================================  =========  =================================
``ConnectionError`` (refused, reset, ``LOADING``, ``NOAUTH``, too many  transient  the server is down, restarting,
clients), socket ``TimeoutError``, ``OSError``                          +reconnect loading its data, or unreachable
``READONLY``                                                            transient  a replica while failing over
``TRYAGAIN``, ``CLUSTERDOWN``, ``MASTERDOWN``                           transient  resharding or failover
``OOM`` (maxmemory), ``Out of memory``                                  transient  wait for memory to be freed
``BUSY``                                                                transient  a script or module call blocks it
``NOPERM``                                                              transient  ACLs: an operator's fix, not data
``Max pending queries exceeded``                                        transient  ``MAX_QUEUED_QUERIES``: overloaded
schema version mismatch (the falkordb client)                           transient  the client refreshed its schema
``Query timed out``                                                     shrink     ``TIMEOUT``: too much at once
``Query's mem consumption exceeded capacity``                           shrink     ``QUERY_MEM_CAPACITY``: the same
``Type mismatch``, ``Property values can only be``, ``null property     permanent  the rows' content (or the statement):
value``, ``constraint``, ``Invalid``, ``Division by zero``, ``expected``,          never accepted as they are
parse errors; ``DataError``, ``ValueError``, ``TypeError`` (the client
cannot encode a parameter)
any other ``RedisError``                                                unknown    see below
======================================================================  =========  =================================

*Transient*: the same statement is retried with jittered exponential backoff (delay capped at ``max_backoff_s``,
time unbounded), which stalls the consumer loop: the pause is the back-pressure, and the stage commits nothing
past rows that are not written. Each retry is counted (``on_retry(op)``); if the daemon is stopping meanwhile,
:class:`WriteAborted` ends the wait (the input is replayed after the restart). Only connection-level errors
(``+reconnect``) drop the connection and mark the writer disconnected for the health check; a busy server keeps it.

*Shrink*: transient, but the statement was too big for the server's per-query bounds, so a batch of more than
one row is retried at once in two halves (each again under these rules; counted as a retry); one row is retried
as it is.

*Permanent*: the batch is split in halves to isolate the offending rows, which are dropped and counted
(``on_rejected(op, n)``); the rest is written.

*Unknown*: the statement is attempted up to ``unknown_attempts`` times with backoff (an unforeseen server
condition that passes loses nothing), then the error is treated as permanent, so that an unforeseen content error
cannot stall the daemon forever. While a batch is split to isolate rows, an unknown error is not retried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.exceptions
import structlog
from falkordb.asyncio import FalkorDB
from falkordb.exceptions import SchemaVersionMismatchException

from processors.graph_rows import SPAN_COLUMNS
from processors.model.graph import UPSERTS, GraphBatch, Row
from sinks.graph import schema
from sinks.graph.endpoint import Endpoint
from sinks.graph.params import header, positional

log = structlog.get_logger("trace_repro.graph")


class WriteAborted(RuntimeError):
    """The daemon is stopping while FalkorDB cannot take a write: give up; the input is replayed after restart."""


class Handling(enum.Enum):
    """What the writer does about one error (see the module docstring)."""

    RECONNECT = "reconnect"  # transient, and the connection is suspect: drop it
    TRANSIENT = "transient"
    SHRINK = "shrink"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the classification table: an error matches when it is one of ``types`` (if any are given) and
    its text starts with one of ``codes`` or contains one of ``phrases`` (case-insensitive; if any are given)."""

    handling: Handling
    types: tuple[type[BaseException], ...] = ()
    codes: tuple[str, ...] = ()
    phrases: tuple[str, ...] = ()

    def matches(self, exc: BaseException, text: str) -> bool:
        if self.types and not isinstance(exc, self.types):
            return False
        if not self.codes and not self.phrases:
            return True
        head = text.split(" ", 1)[0].upper()
        return head in self.codes or any(p in text.lower() for p in self.phrases)


_RE = redis.exceptions
_SERVER_STATE = (_RE.ReadOnlyError, _RE.TryAgainError, _RE.ClusterDownError, _RE.OutOfMemoryError)
_SERVER_CODES = ("LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "OOM", "BUSY", "NOPERM")
_CONTENT = ("type mismatch", "property values can only be", "null property value", "constraint", "invalid")
_STATEMENT = ("division by zero", "errors encountered", "expected", "unknown function")
RULES: tuple[Rule, ...] = (
    Rule(Handling.RECONNECT, (_RE.ConnectionError, _RE.TimeoutError, OSError, TimeoutError)),
    Rule(Handling.TRANSIENT, (*_SERVER_STATE, _RE.NoPermissionError, SchemaVersionMismatchException)),
    Rule(Handling.TRANSIENT, (_RE.ResponseError,), _SERVER_CODES, ("max pending queries exceeded", "out of memory")),
    Rule(Handling.SHRINK, (_RE.ResponseError,), phrases=("query timed out", "exceeded capacity")),
    Rule(Handling.PERMANENT, (_RE.ResponseError,), phrases=_CONTENT + _STATEMENT),
    Rule(Handling.PERMANENT, (_RE.DataError, ValueError, TypeError)),
)
_CAUGHT = (_RE.RedisError, SchemaVersionMismatchException, OSError, TimeoutError, ValueError, TypeError)


def classify(exc: BaseException) -> Handling:
    """How the writer handles ``exc``: the first rule of :data:`RULES` that matches, else ``UNKNOWN``."""
    text = str(exc)
    for rule in RULES:
        if rule.matches(exc, text):
            return rule.handling
    return Handling.UNKNOWN


class _Refused(Exception):
    """Internal: the statement failed in a way that splitting the rows may help (``handling`` says how)."""

    def __init__(self, handling: Handling, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.handling = handling
        self.cause = cause


def _with_rows(statement: str, rows: list[Any]) -> str:
    """The query text of ``statement`` over ``rows``: its ``CYPHER rows=...`` header first (see ``params``)."""
    statement, sent = positional(statement, rows)
    return header({"rows": sent}) + statement


def _rows_for(batch: GraphBatch, name: str) -> list[Any]:
    rows: list[Row] = getattr(batch, name)
    if name in (
        "traces",
        "late_traces",
    ):  # positional; under ``paths`` the kept spans are positional lists in the row already
        return [[r["id"], r["root"], r["service"], r["start"], r["end"], r["status"], r["version"], r["rooted"],
                 r.get("omitted"), r.get("spans", [])] for r in rows]  # fmt: skip
    if name == "spans":  # positional: FalkorDB's parameter header would repeat every key for every row
        return [[r[c] for c in SPAN_COLUMNS] for r in rows]
    if name == "child_of":
        return [[r["id"], r["parent"]] for r in rows]
    if name in ("services", "operations"):
        unique = {r.get("key", r.get("name")): r for r in rows}
        return list(unique.values())
    return rows


class GraphWriter:
    """Writes :class:`GraphBatch` es to one FalkorDB graph; see the module docstring for failure handling."""

    def __init__(
        self,
        url: str | Endpoint,
        graph: str,
        *,
        batch_rows: int = 2000,
        timeout_ms: int = 30_000,
        on_retry: Callable[[str], None] | None = None,
        on_rejected: Callable[[str, int], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stopping: asyncio.Event | None = None,
        backoff_s: float = 0.1,
        max_backoff_s: float = 10.0,
        unknown_attempts: int = 5,
        connect: Callable[[], Awaitable[Any]] | None = None,
    ) -> None:
        self.endpoint = url if isinstance(url, Endpoint) else Endpoint.parse(url)  # user, password and TLS honoured
        self.graph_name = graph
        self.batch_rows = batch_rows
        self.timeout_ms = timeout_ms
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.unknown_attempts = max(1, unknown_attempts)
        self._on_retry = on_retry or (lambda _op: None)
        self._on_rejected = on_rejected or (lambda _op, _n: None)
        self._sleep = sleep
        self._stopping = stopping
        self._connect_graph = connect or self._connect_falkordb  # a fake graph client in unit tests
        self._db: Any = None
        self._graph: Any = None
        self.ready = False
        self.connected = False

    def __repr__(self) -> str:
        return f"GraphWriter({self.endpoint}, graph={self.graph_name!r})"

    async def _connect_falkordb(self) -> Any:
        """The async client's graph; its constructor talks to the server, so it is retried like a query."""
        if self._db is not None:  # the previous client's connections are suspect: close them
            with contextlib.suppress(Exception):
                await self._db.connection.aclose()
            self._db = None
        db = FalkorDB(**self.endpoint.client_kwargs(), socket_timeout=self.timeout_ms / 1000 + 5)
        try:
            await db.connection.ping()
        except BaseException:
            with contextlib.suppress(Exception):
                await db.connection.aclose()
            raise
        self._db = db
        return db.select_graph(self.graph_name)

    def _backoff(self, attempt: int) -> float:
        """Equal-jitter exponential delay before retry ``attempt`` (1-based), never above ``max_backoff_s``."""
        ceiling: float = min(self.max_backoff_s, self.backoff_s * 2.0 ** min(attempt - 1, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    async def _retrying(
        self,
        what: str,
        action: Callable[[], Awaitable[Any]],
        *,
        shrinkable: bool = False,
        unknown_attempts: int | None = None,
    ) -> Any:
        """Run ``action`` until it succeeds, retrying transient errors (module docstring). Raises ``_Refused`` for
        a permanent error, an unknown one retried ``unknown_attempts`` times, or (when ``shrinkable``) a statement
        too big for the server; :class:`WriteAborted` when the daemon stops during a retry."""
        budget = self.unknown_attempts if unknown_attempts is None else unknown_attempts
        attempt = unknown = 0
        while True:
            try:
                if self._graph is None:
                    self._graph = await self._connect_graph()
                    self.connected = True
                return await action()
            except _CAUGHT as exc:
                handling = classify(exc)
                if handling is Handling.PERMANENT:
                    raise _Refused(handling, exc) from exc
                if handling is Handling.UNKNOWN:
                    unknown += 1
                    if unknown >= budget:
                        raise _Refused(Handling.PERMANENT, exc) from exc
                if handling is Handling.SHRINK and shrinkable:
                    self._on_retry(what)
                    log.warning("graph.shrink", op=what, error=str(exc)[:200])
                    raise _Refused(handling, exc) from exc
                if handling is Handling.RECONNECT:
                    self.connected = False
                    self._graph = None
                if self._stopping is not None and self._stopping.is_set():
                    raise WriteAborted(f"{what}: FalkorDB cannot take the write while stopping") from exc
                attempt += 1
                delay = self._backoff(attempt)
                self._on_retry(what)
                log.warning("graph.retry", op=what, handling=handling.value, error=str(exc)[:200],
                            attempt=attempt, backoff_s=round(delay, 3))  # fmt: skip
                await self._sleep(delay)

    async def bootstrap(self, poll_s: float = 0.05) -> None:
        """Create every index and unique constraint, then wait until all are OPERATIONAL."""

        async def create() -> None:
            existing = await self._index_states()
            for label, prop in schema.INDEXES:
                if (label, prop) not in existing:
                    try:
                        await self._graph.query(schema.create_index(label, prop))
                    except redis.exceptions.ResponseError as exc:
                        if "already indexed" not in str(exc):
                            raise
            for label, prop in schema.UNIQUE:
                try:
                    await self._db.connection.execute_command(
                        "GRAPH.CONSTRAINT", "CREATE", self.graph_name, "UNIQUE", "NODE", label, "PROPERTIES", 1, prop
                    )
                except redis.exceptions.ResponseError as exc:
                    if "already exists" not in str(exc).lower():
                        raise

        await self._run("bootstrap", create)
        while True:
            states = await self._run("bootstrap", self._index_states)
            constraints = await self._run("bootstrap", self._constraint_states)
            if all(states.get(i) == "OPERATIONAL" for i in schema.INDEXES) and all(
                constraints.get(c) == "OPERATIONAL" for c in schema.UNIQUE
            ):
                break
            await self._sleep(poll_s)
        self.ready = True
        log.info("graph.ready", graph=self.graph_name, indexes=len(schema.INDEXES), constraints=len(schema.UNIQUE))

    async def _index_states(self) -> dict[tuple[str, str], str]:
        result = await self._graph.query(schema.INDEX_STATES)
        out: dict[tuple[str, str], str] = {}
        for label, props, status in result.result_set:
            for prop in props:
                out[(label, prop)] = status
        return out

    async def _constraint_states(self) -> dict[tuple[str, str], str]:
        result = await self._graph.query(schema.CONSTRAINT_STATES)
        return {(label, props[0]): status for kind, label, props, status in result.result_set if kind == "UNIQUE"}

    async def write(self, batch: GraphBatch) -> int:
        """Upsert ``batch``, then adopt its waiting spans; returns the rows written."""
        written = await self.upsert(batch)
        await self.adopt(batch)
        return written

    async def upsert(self, batch: GraphBatch) -> int:
        """Write every statement's rows in chunks of ``batch_rows``; returns the rows written."""
        written = 0
        for name in UPSERTS:
            statement, rows = schema.UPSERTS[name], _rows_for(batch, name)
            for start in range(0, len(rows), self.batch_rows):
                written += await self.write_rows(name, statement, rows[start : start + self.batch_rows])
        return written

    async def adopt(self, batch: GraphBatch) -> None:
        """Link the spans of the traces ``batch`` wrote that wait for a parent now in the graph (:data:`ADOPT`); not
        counted as rows written: it only links the fragments of those traces."""
        traces = list(dict.fromkeys([r["id"] for r in batch.traces + batch.late_traces] +
                                    [r["trace"] for r in batch.spans]))  # fmt: skip
        for start in range(0, len(traces), self.batch_rows):
            await self.write_rows("adopt", schema.ADOPT, traces[start : start + self.batch_rows])

    async def write_rows(self, name: str, statement: str, rows: Sequence[Any]) -> int:
        """Write ``rows`` with ``statement``; rows the graph refuses are isolated by halving, dropped and counted."""
        return await self._write_rows(name, statement, list(rows), self.unknown_attempts)

    async def _write_rows(self, name: str, statement: str, rows: list[Any], unknown_attempts: int) -> int:
        if not rows:
            return 0
        try:
            await self._retrying(name, lambda: self._graph.query(_with_rows(statement, rows), timeout=self.timeout_ms),
                                 shrinkable=len(rows) > 1, unknown_attempts=unknown_attempts)  # fmt: skip
            return len(rows)
        except _Refused as refused:
            if refused.handling is Handling.PERMANENT and len(rows) == 1:
                self._on_rejected(name, 1)
                log.error("graph.row_rejected", op=name, error=str(refused.cause)[:300])
                return 0
            # Halves: a permanent error isolates its rows (unknown errors are not retried again while isolating);
            # a statement too big for the server is simply written in smaller pieces.
            again = 1 if refused.handling is Handling.PERMANENT else unknown_attempts
            mid = len(rows) // 2
            return await self._write_rows(name, statement, rows[:mid], again) + await self._write_rows(
                name, statement, rows[mid:], again
            )

    async def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """One statement of ``schema`` (a read, or a write of one event's rows), retried like writes; a permanent
        error is raised as FalkorDB's own exception."""
        text = header(params or {}) + cypher
        result = await self._run("query", lambda: self._graph.query(text, timeout=self.timeout_ms))
        return [list(row) for row in result.result_set]

    async def _run(self, what: str, action: Callable[[], Awaitable[Any]]) -> Any:
        """:meth:`_retrying`, raising the original error of a refusal (for callers that do not split rows)."""
        try:
            return await self._retrying(what, action)
        except _Refused as refused:
            raise refused.cause from None

    async def expire_spans(self, cutoff_ms: float, limit: int = 5000) -> int:
        """Delete raw Span and Trace nodes older than ``cutoff_ms`` (event time), ``limit`` per call."""
        deleted = 0
        for cypher in schema.EXPIRE:
            rows = await self.query(cypher, {"cutoff": cutoff_ms, "limit": limit})
            deleted += int(rows[0][0]) if rows else 0
        return deleted

    async def close(self) -> None:
        if self._db is not None:
            await self._db.connection.aclose()
