"""The FalkorDB graph writer: schema bootstrap, batched idempotent upserts, retries, retention.

Every statement is ``UNWIND $rows AS r MERGE ...`` on an indexed key (or, for spans, a read of those there and a
CREATE of the others: :mod:`sinks.graph.schema.traces`, written by :mod:`sinks.graph.trace_writes`), so replaying
input changes nothing.
Indexes and unique constraints are created before the first write and polled until OPERATIONAL (FalkorDB builds
them in the background, and MERGE on an unindexed label scans the whole label per row).

**Failures** are classified by :func:`sinks.graph.errors.classify` (the table is there):

*Transient* (and *unknown*): the same statement is retried with jittered exponential backoff (delay capped at
``max_backoff_s``, time unbounded), which stalls the consumer loop: the pause is the back-pressure, and the stage
commits nothing past rows that are not written. Each retry is counted (``on_retry(op)``), an unknown error also as
``unknown_errors``; while a statement keeps failing the ``write_stalled`` gauge is 1 and, after
``STALLED_UNHEALTHY_S``, the health check fails. If the daemon is stopping meanwhile, :class:`WriteAborted` ends the
wait (the input is replayed after the restart). Only connection-level errors (``+reconnect``) drop the connection
and mark the writer disconnected; a busy server keeps it.

*Shrink*: the statement was too big for the server's per-query bounds: a batch of more than one row is retried at
once in two halves (each again under these rules; counted as a retry). One row alone is split if it can be (a
trace's kept spans in halves, ``rows_split``), else written with its longest texts trimmed, the limit halved until
the server takes it (``rows_trimmed``, each text marked); a row with nothing left to trim is retried as transient.

*Content*: the batch is split in halves to isolate the rows the graph refuses; each one is counted
(``on_rejected(op, n)``) and handed to the caller's ``dead`` list as a :class:`~sinks.graph.rows.DeadRow`, which the
runtime dead-letters before it commits; the rest is written.

Values FalkorDB cannot hold (NUL, lone surrogates, NaN, infinity) are replaced in the parameter header and counted
(``replaced_values``): see :mod:`sinks.graph.params`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis.exceptions
import structlog
from falkordb.asyncio import FalkorDB

from processors.api.telemetry import Telemetry
from processors.model.graph import UPSERTS, GraphBatch
from sinks.graph import schema, trace_writes
from sinks.graph.endpoint import Endpoint
from sinks.graph.errors import CAUGHT, Handling, Refused, classify
from sinks.graph.params import positional, render
from sinks.graph.rows import TRIM_FLOOR, DeadRow, longest_text, rows_for, split, trimmed
from sinks.graph.schema import traces

log = structlog.get_logger("trace_repro.graph")

__all__ = ["DeadRow", "GraphWriter", "Handling", "WriteAborted", "classify"]

STALLED_UNHEALTHY_S = 10.0  # a statement failing this long makes the health check fail (an alert, /readyz)


class WriteAborted(RuntimeError):
    """The daemon is stopping while FalkorDB cannot take a write: give up; the input is replayed after restart."""


def _with_rows(statement: str, rows: list[Any]) -> tuple[str, int]:
    """The query text of ``statement`` over ``rows``: its ``CYPHER rows=...`` header first (see ``params``), and how
    many values the header replaced."""
    statement, sent = positional(statement, rows)
    return render({"rows": sent}, statement)


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
        connect: Callable[[], Awaitable[Any]] | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.endpoint = url if isinstance(url, Endpoint) else Endpoint.parse(url)
        self.graph_name = graph
        self.batch_rows = batch_rows
        self.timeout_ms = timeout_ms
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.telemetry = telemetry or Telemetry("graph")
        self._on_retry = on_retry or (lambda _op: None)
        self._on_rejected = on_rejected or (lambda _op, _n: None)
        self._sleep = sleep
        self._stopping = stopping
        self._connect_graph = connect or self._connect_falkordb  # a fake graph client in unit tests
        self._db: Any = None
        self._graph: Any = None
        self._failing: dict[int, float] = {}  # statements being retried: id -> when they first failed (monotonic)
        self.ready = False
        self.connected = False
        # for the bench's A/Bs: rows of new spans with ``traces.FRESH``, new traces CREATEd, empty details stored;
        self.create_fresh, self.create_traces, self.empty_details = True, True, False
        self.present_every_span = False  # the read of present spans naming every span, not only access spans

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

    def stalled_s(self) -> float:
        """How long the oldest statement still being retried has been failing (0 when none is)."""
        return time.monotonic() - min(self._failing.values()) if self._failing else 0.0

    def healthy(self) -> bool:
        return self.ready and self.connected and self.stalled_s() < STALLED_UNHEALTHY_S

    async def _retrying(self, what: str, action: Callable[[], Awaitable[Any]], *, shrinkable: bool = False) -> Any:
        """Run ``action`` until it succeeds, retrying transient and unknown errors (module docstring). Raises
        ``Refused`` for a content error or (when ``shrinkable``) a statement too big for the server;
        :class:`WriteAborted` when the daemon stops during a retry."""
        attempt = 0
        token = id(action)
        try:
            while True:
                try:
                    if self._graph is None:
                        self._graph = await self._connect_graph()
                        self.connected = True
                    return await action()
                except CAUGHT as exc:
                    handling = classify(exc)
                    if handling is Handling.CONTENT:
                        raise Refused(handling, exc) from exc
                    if handling is Handling.SHRINK and shrinkable:
                        self._on_retry(what)
                        log.warning("graph.shrink", op=what, error=str(exc)[:200])
                        raise Refused(handling, exc) from exc
                    if handling is Handling.RECONNECT:
                        self.connected = False
                        self._graph = None
                    if handling is Handling.UNKNOWN:
                        self.telemetry.count("unknown_errors")
                    if self._stopping is not None and self._stopping.is_set():
                        raise WriteAborted(f"{what}: FalkorDB cannot take the write while stopping") from exc
                    self._failing.setdefault(token, time.monotonic())
                    self.telemetry.gauge("write_stalled", 1)
                    attempt += 1
                    delay = self._backoff(attempt)
                    self._on_retry(what)
                    log.warning("graph.retry", op=what, handling=handling.value, error=str(exc)[:200],
                                attempt=attempt, backoff_s=round(delay, 3))  # fmt: skip
                    await self._sleep(delay)
        finally:
            if self._failing.pop(token, None) is not None and not self._failing:
                self.telemetry.gauge("write_stalled", 0)

    async def bootstrap(self, poll_s: float = 0.05) -> None:
        """Create every index and unique constraint, then wait until all are OPERATIONAL."""

        async def create() -> None:
            existing = await self._index_states()
            for label, prop in schema.INDEXES + schema.EDGE_INDEXES:
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
            if all(states.get(i) == "OPERATIONAL" for i in schema.INDEXES + schema.EDGE_INDEXES) and all(
                constraints.get(c) == "OPERATIONAL" for c in schema.UNIQUE
            ):
                break
            await self._sleep(poll_s)
        self.ready = True
        log.info("graph.ready", graph=self.graph_name, indexes=len(schema.INDEXES) + len(schema.EDGE_INDEXES),
                 constraints=len(schema.UNIQUE))  # fmt: skip
        await self._check_effects()

    async def _check_effects(self) -> None:
        """Warn when the server may write effects to its AOF: FalkorDB before 4.20.4 crashes replaying effects left
        by a write refused half-way (FalkorDB#2235), and the writer's isolation of refused rows makes such writes.
        ``EFFECTS_THRESHOLD`` at or above ``TIMEOUT_MAX`` (µs, ms) keeps every write a query in the AOF."""
        try:
            config = dict(await self._db.connection.execute_command("GRAPH.CONFIG", "GET", "*"))
            threshold_us, timeout_ms = int(config["EFFECTS_THRESHOLD"]), int(config["TIMEOUT_MAX"])
        except Exception:  # an older server, or no right to read its config: nothing to say
            return
        if timeout_ms <= 0 or threshold_us < 1000 * timeout_ms:
            log.warning("graph.effects_replication", effects_threshold_us=threshold_us, timeout_max_ms=timeout_ms,
                        hint="start FalkorDB with EFFECTS_THRESHOLD >= 1000 x TIMEOUT_MAX (FalkorDB#2235)")  # fmt: skip

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

    async def write(self, batch: GraphBatch, dead: list[DeadRow] | None = None) -> int:
        """Upsert ``batch``, then adopt its waiting spans; returns the rows written (refused rows go to ``dead``)."""
        settled: dict[str, bool] = {}
        written = await self.upsert(batch, dead, settled)
        await self.adopt(batch, dead, settled)
        return written

    async def upsert(self, batch: GraphBatch, dead: list[DeadRow] | None = None,
                     settled: dict[str, bool] | None = None) -> int:  # fmt: skip
        """Write every statement's rows in chunks of ``batch_rows``; returns the rows written. ``settled`` gets, for
        each trace of a trace row, whether all its rows left no span that :data:`ADOPT` could link."""
        written = 0
        accessed = None if self.present_every_span else {
            r["span"] for rows in (batch.reads, batch.writes, batch.predicates, batch.changes) for r in rows
            if r.get("span")}  # fmt: skip
        for name in UPSERTS:
            statement, rows = schema.UPSERTS[name], rows_for(batch, name, empty=self.empty_details)
            for start in range(0, len(rows), self.batch_rows):
                chunk = rows[start : start + self.batch_rows]
                if name in traces.MERGING:
                    written += await trace_writes.write(
                        self, name, chunk, dead, {} if settled is None else settled, accessed
                    )
                else:
                    written += await self.write_rows(name, statement, chunk, dead)
        return written

    async def adopt(self, batch: GraphBatch, dead: list[DeadRow] | None = None,
                    settled: dict[str, bool] | None = None) -> None:  # fmt: skip
        """Link the spans of the traces ``batch`` wrote (not ``settled`` by :meth:`upsert`) that wait for a parent now
        in the graph (:data:`ADOPT`); not counted as rows written: it only links the fragments of those traces."""
        spans = [r["trace"] for r in batch.spans]
        traces = list(dict.fromkeys([r["id"] for r in batch.traces + batch.late_traces
                                     if not (settled or {}).get(r["id"])] + spans))  # fmt: skip
        for start in range(0, len(traces), self.batch_rows):
            await self.write_rows("adopt", schema.ADOPT, traces[start : start + self.batch_rows], dead)

    async def write_rows(self, name: str, statement: str, rows: Sequence[Any], dead: list[DeadRow] | None = None,
                         results: list[list[Any]] | None = None) -> int:  # fmt: skip
        """Write ``rows`` with ``statement``; rows the graph refuses for their content are isolated by halving,
        counted and appended to ``dead`` (logged with their content when there is no ``dead``). The statement's
        result rows go to ``results`` when it is given."""
        return await self._write_rows(name, statement, list(rows), dead, results)

    async def _statement(self, name: str, statement: str, rows: list[Any], results: list[list[Any]] | None,
                         *, shrinkable: bool) -> None:  # fmt: skip
        text, replaced = _with_rows(statement, rows)
        result = await self._retrying(name, lambda: self._graph.query(text, timeout=self.timeout_ms),
                                      shrinkable=shrinkable)  # fmt: skip
        self.telemetry.count("replaced_values", replaced)
        if results is not None:
            results.extend(list(row) for row in result.result_set)

    async def _write_rows(self, name: str, statement: str, rows: list[Any], dead: list[DeadRow] | None,
                          results: list[list[Any]] | None) -> int:  # fmt: skip
        if not rows:
            return 0
        try:
            await self._statement(name, statement, rows, results, shrinkable=True)
            return len(rows)
        except Refused as refused:
            if len(rows) > 1:  # isolate the rows the graph refuses, or write a statement too big in smaller pieces
                mid = len(rows) // 2
                return await self._write_rows(name, statement, rows[:mid], dead, results) + await self._write_rows(
                    name, statement, rows[mid:], dead, results
                )
            if refused.handling is Handling.CONTENT:
                self._dead(name, rows[0], refused.cause, dead)
                return 0
            return await self._oversized(name, statement, rows[0], dead, results)

    async def _oversized(self, name: str, statement: str, row: Any, dead: list[DeadRow] | None,
                         results: list[list[Any]] | None) -> int:  # fmt: skip
        """One row too big for the server alone: split it, else trim its longest texts (module docstring)."""
        parts = split(name, row)
        if parts:
            self.telemetry.count("rows_split")
            log.warning("graph.row_split", op=name, parts=len(parts))
            return min(1, await self._write_rows(name, statement, parts, dead, results))
        limit = longest_text(row) // 2
        while limit >= TRIM_FLOOR:
            try:
                await self._statement(name, statement, [trimmed(row, limit)], results, shrinkable=True)
            except Refused as refused:
                if refused.handling is Handling.CONTENT:
                    self._dead(name, row, refused.cause, dead)
                    return 0
                limit //= 2
                continue
            self.telemetry.count("rows_trimmed")
            log.warning("graph.row_trimmed", op=name, longest=longest_text(row), kept=limit)
            return 1
        # Nothing left to trim: size is not the cause (the server is overloaded): retry as transient.
        try:
            await self._statement(name, statement, [trimmed(row, TRIM_FLOOR)], results, shrinkable=False)
        except Refused as refused:
            self._dead(name, row, refused.cause, dead)
            return 0
        return 1

    def _dead(self, name: str, row: Any, cause: BaseException, dead: list[DeadRow] | None) -> None:
        """A row refused for its content: counted, and handed over to be dead-lettered."""
        self._on_rejected(name, 1)
        entry = DeadRow(name, row, f"{type(cause).__name__}: {cause}"[:1000])
        log.error("graph.row_rejected", op=name, error=entry.error[:300], dead_lettered=dead is not None)
        if dead is not None:
            dead.append(entry)
        else:  # a caller outside the runtime (a tool, a test): the row's content goes to the log, not nowhere
            log.error("graph.row_content", op=name, row=json.dumps(entry.row, default=str)[:100_000])

    async def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """One statement of ``schema`` (a read, or a write of one event's rows), retried like writes; a content
        error is raised as FalkorDB's own exception."""
        text, _ = render(params or {}, cypher)
        result = await self._run("query", lambda: self._graph.query(text, timeout=self.timeout_ms))
        return [list(row) for row in result.result_set]

    def check_stopping(self, what: str) -> None:
        """Raise :class:`WriteAborted` if the daemon is stopping (for a caller waiting on the graph's state)."""
        if self._stopping is not None and self._stopping.is_set():
            raise WriteAborted(f"{what}: stopping")

    async def _run(self, what: str, action: Callable[[], Awaitable[Any]]) -> Any:
        """:meth:`_retrying`, raising the original error of a refusal (for callers that do not split rows)."""
        try:
            return await self._retrying(what, action)
        except Refused as refused:
            raise refused.cause from None

    async def expire(self, cutoffs: dict[str, float], limit: int = 5000) -> dict[str, int]:
        """Apply every retention rule of :data:`schema.EXPIRE` with the cut-off of its horizon (event time, ms),
        ``limit`` deletions per statement, repeated until a statement deletes fewer; returns what each deleted."""
        deleted: dict[str, int] = {}
        for name, horizon, cypher in schema.EXPIRE:
            total = 0
            while True:
                rows = await self.query(cypher, {"cutoff": cutoffs[horizon], "limit": limit})
                n = int(rows[0][0] or 0) if rows else 0
                total += n
                if n < limit:
                    break
            deleted[name] = total
        return deleted

    async def close(self) -> None:
        if self._db is not None:
            await self._db.connection.aclose()
