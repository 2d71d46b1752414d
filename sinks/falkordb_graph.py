"""The FalkorDB graph writer: schema bootstrap, batched idempotent upserts, retries, retention.

Every statement is ``UNWIND $rows AS r MERGE ...`` on an indexed key, so replaying input changes nothing.
Indexes and unique constraints are created before the first write and polled until OPERATIONAL (FalkorDB builds
them in the background, and MERGE on an unindexed label scans the whole label per row).

Failures are of two kinds. A lost connection, a timeout or a server still loading is *retryable*: the write
is retried with jittered exponential backoff for as long as it takes, which stalls the consumer loop (the
back-pressure is the pause). A ``ResponseError`` for one statement is *permanent*: the batch is split to
isolate the offending rows, which are dropped and counted (``rejected``), and the rest is written.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlparse

import redis.exceptions
import structlog
from falkordb.asyncio import FalkorDB

from processors.graph_rows import SPAN_COLUMNS, GraphBatch, Row

log = structlog.get_logger("trace_repro.graph")


class WriteAborted(RuntimeError):
    """The daemon is stopping while FalkorDB is unreachable: give up; the input is replayed after restart."""


INDEXES: tuple[tuple[str, str], ...] = (
    ("Service", "name"),
    ("Operation", "key"),
    ("Trace", "id"),
    ("Trace", "start"),
    ("Span", "id"),
    ("Span", "end"),
    ("Entity", "key"),
    ("Window", "id"),
    ("Incident", "fingerprint"),
    ("Repro", "path"),
    ("Repair", "key"),
    ("Contract", "signature"),
    ("Verdict", "key"),
)
UNIQUE: tuple[tuple[str, str], ...] = (
    ("Service", "name"),
    ("Operation", "key"),
    ("Trace", "id"),
    ("Span", "id"),
    ("Entity", "key"),
    ("Window", "id"),
    ("Incident", "fingerprint"),
)

STATEMENTS: dict[str, str] = {
    "services": "UNWIND $rows AS r MERGE (:Service {name: r.name})",
    "operations": (
        "UNWIND $rows AS r MERGE (o:Operation {key: r.key}) SET o.service = r.service, o.name = r.name "
        "WITH o, r MATCH (s:Service {name: r.service}) MERGE (s)-[:EXPOSES]->(o)"
    ),
    "traces": (
        "UNWIND $rows AS r MERGE (t:Trace {id: r.id}) SET t.root = r.root, t.service = r.service, "
        "t.start = r.start, t.duration_ms = r.duration_ms, t.status = r.status, t.version = r.version"
    ),
    "spans": (
        "UNWIND $rows AS r MERGE (s:Span {id: r[0]}) SET "
        + ", ".join(f"s.{c} = r[{i}]" for i, c in enumerate(SPAN_COLUMNS) if c != "id")
        + " WITH s, r MATCH (t:Trace {id: r[1]}) MERGE (s)-[:OF]->(t)"
    ),
    "child_of": ("UNWIND $rows AS r MATCH (c:Span {id: r[0]}) MATCH (p:Span {id: r[1]}) MERGE (c)-[:CHILD_OF]->(p)"),
    "entities": "UNWIND $rows AS r MERGE (e:Entity {key: r.entity_key}) SET e.table = r.table",
    "reads": (
        "UNWIND $rows AS r MATCH (s:Span {id: r.span}) MATCH (e:Entity {key: r.entity}) "
        "MERGE (s)-[x:READ]->(e) SET x.at = r.at, x.lock = r.lock, x.version = r.version, x.params = r.params, "
        "x.function = r.function, x.file = r.file"
    ),
    "writes": (
        "UNWIND $rows AS r MATCH (s:Span {id: r.span}) MATCH (e:Entity {key: r.entity}) "
        "MERGE (s)-[x:WROTE]->(e) SET x.at = r.at, x.lock = r.lock, x.op = r.op, x.params = r.params, "
        "x.function = r.function, x.file = r.file"
    ),
    "windows": "UNWIND $rows AS r MERGE (w:Window {id: r.id}) SET w.start = r.start, w.end = r.end",
    "calls": (
        "UNWIND $rows AS r MATCH (a:Service {name: r.caller}) MATCH (b:Service {name: r.callee}) "
        "MERGE (a)-[c:CALLS {window: r.window}]->(b) "
        "SET c.count = r.count, c.errors = r.errors, c.p50_ms = r.p50_ms, c.p95_ms = r.p95_ms"
    ),
    # Committed row changes (stage 2): the entity's last image; the WROTE edge gets the commit facts and the
    # strength of the correlation. MERGE on the Span creates a placeholder if stage 1 has not written it yet.
    "changes": (
        "UNWIND $rows AS r MERGE (e:Entity {key: r.entity}) "
        "SET e.table = r.table, e.lsn = r.lsn, e.image = coalesce(r.after, r.before), e.deleted = (r.op = 'd') "
        "WITH e, r WHERE r.span IS NOT NULL "
        "MERGE (s:Span {id: r.span}) MERGE (s)-[w:WROTE]->(e) "
        "SET w.lsn = r.lsn, w.tx = r.tx, w.commit_ms = r.commit_ms, w.before = r.before, w.after = r.after, "
        "w.correlation = r.strength, w.skew_ms = r.skew_ms"
    ),
}

RETRYABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    OSError,
)


def _rows_for(batch: GraphBatch, name: str) -> list[Any]:
    rows: list[Row] = getattr(batch, name)
    if name == "spans":  # positional: FalkorDB's parameter header would repeat every key for every row
        return [[r[c] for c in SPAN_COLUMNS] for r in rows]
    if name == "child_of":
        return [[r["id"], r["parent"]] for r in rows]
    if name == "entities":  # the statement names the key r.entity_key (``key`` is a Cypher keyword in maps)
        return [{"entity_key": r["key"], "table": r["table"]} for r in rows]
    if name in ("services", "operations", "entities"):
        unique = {r.get("key", r.get("name")): r for r in rows}
        return list(unique.values())
    return rows


class GraphWriter:
    """Writes :class:`GraphBatch` es to one FalkorDB graph; see the module docstring for failure handling."""

    def __init__(
        self,
        url: str,
        graph: str,
        *,
        batch_rows: int = 2000,
        timeout_ms: int = 30_000,
        on_retry: Callable[[str], None] | None = None,
        on_rejected: Callable[[str, int], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        stopping: asyncio.Event | None = None,
    ) -> None:
        parsed = urlparse(url)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 6379
        self.graph_name = graph
        self.batch_rows = batch_rows
        self.timeout_ms = timeout_ms
        self._on_retry = on_retry or (lambda _op: None)
        self._on_rejected = on_rejected or (lambda _op, _n: None)
        self._sleep = sleep
        self._stopping = stopping
        self._db: Any = None
        self._graph: Any = None
        self.ready = False
        self.connected = False

    async def _connect(self) -> None:
        """Build the async client; its constructor talks to the server, so it is retried like a query."""
        db = FalkorDB(host=self.host, port=self.port, socket_timeout=self.timeout_ms / 1000 + 5)
        await db.connection.ping()
        self._db = db
        self._graph = db.select_graph(self.graph_name)
        self.connected = True

    async def _retrying(self, what: str, action: Callable[[], Awaitable[Any]]) -> Any:
        delay = 0.1
        while True:
            try:
                if self._graph is None:
                    await self._connect()
                return await action()
            except RETRYABLE as exc:
                self.connected = False
                self._graph = None
                if self._stopping is not None and self._stopping.is_set():
                    raise WriteAborted(f"{what}: FalkorDB unreachable while stopping") from exc
                self._on_retry(what)
                log.warning("graph.retry", op=what, error=str(exc)[:200], backoff_s=round(delay, 2))
                await self._sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, 10.0)

    async def bootstrap(self, poll_s: float = 0.05) -> None:
        """Create every index and unique constraint, then wait until all are OPERATIONAL."""

        async def create() -> None:
            existing = await self._index_states()
            for label, prop in INDEXES:
                if (label, prop) not in existing:
                    try:
                        await self._graph.query(f"CREATE INDEX FOR (n:{label}) ON (n.{prop})")
                    except redis.exceptions.ResponseError as exc:
                        if "already indexed" not in str(exc):
                            raise
            for label, prop in UNIQUE:
                try:
                    await self._db.connection.execute_command(
                        "GRAPH.CONSTRAINT", "CREATE", self.graph_name, "UNIQUE", "NODE", label, "PROPERTIES", 1, prop
                    )
                except redis.exceptions.ResponseError as exc:
                    if "already exists" not in str(exc).lower():
                        raise

        await self._retrying("bootstrap", create)
        while True:
            states = await self._retrying("bootstrap", self._index_states)
            constraints = await self._retrying("bootstrap", self._constraint_states)
            if all(states.get(i) == "OPERATIONAL" for i in INDEXES) and all(
                constraints.get(c) == "OPERATIONAL" for c in UNIQUE
            ):
                break
            await self._sleep(poll_s)
        self.ready = True
        log.info("graph.ready", graph=self.graph_name, indexes=len(INDEXES), constraints=len(UNIQUE))

    async def _index_states(self) -> dict[tuple[str, str], str]:
        result = await self._graph.query("CALL db.indexes() YIELD label, properties, status")
        out: dict[tuple[str, str], str] = {}
        for label, props, status in result.result_set:
            for prop in props:
                out[(label, prop)] = status
        return out

    async def _constraint_states(self) -> dict[tuple[str, str], str]:
        result = await self._graph.query("CALL db.constraints() YIELD type, label, properties, status")
        return {(label, props[0]): status for kind, label, props, status in result.result_set if kind == "UNIQUE"}

    async def write(self, batch: GraphBatch) -> int:
        """Write every statement's rows in chunks of ``batch_rows``; returns the rows written."""
        written = 0
        statements = [(name, statement, _rows_for(batch, name)) for name, statement in STATEMENTS.items()]
        statements += [("extra", statement, rows) for statement, rows in batch.extra]
        for name, statement, rows in statements:
            for start in range(0, len(rows), self.batch_rows):
                written += await self._write_rows(name, statement, rows[start : start + self.batch_rows])
        return written

    async def _write_rows(self, name: str, statement: str, rows: Sequence[Any]) -> int:
        if not rows:
            return 0
        try:
            await self._retrying(
                name, lambda: self._graph.query(statement, {"rows": list(rows)}, timeout=self.timeout_ms)
            )
            return len(rows)
        except redis.exceptions.ResponseError as exc:
            if len(rows) == 1:
                self._on_rejected(name, 1)
                log.error("graph.row_rejected", op=name, error=str(exc)[:300])
                return 0
            mid = len(rows) // 2
            return await self._write_rows(name, statement, rows[:mid]) + await self._write_rows(
                name, statement, rows[mid:]
            )

    async def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """A read query (for tests, the CLI and detectors), retried like writes."""
        result = await self._retrying("query", lambda: self._graph.query(cypher, params or {}, timeout=self.timeout_ms))
        return [list(row) for row in result.result_set]

    async def expire_spans(self, cutoff_ms: float, limit: int = 5000) -> int:
        """Delete raw Span and Trace nodes older than ``cutoff_ms`` (event time), ``limit`` per call."""
        deleted = 0
        for cypher in (
            "MATCH (s:Span) WHERE s.end < $cutoff WITH s LIMIT $limit DETACH DELETE s RETURN count(s)",
            "MATCH (t:Trace) WHERE t.start < $cutoff AND NOT (t)<-[:OF]-(:Span) "
            "WITH t LIMIT $limit DETACH DELETE t RETURN count(t)",
        ):
            rows = await self.query(cypher, {"cutoff": cutoff_ms, "limit": limit})
            deleted += int(rows[0][0]) if rows else 0
        return deleted

    async def close(self) -> None:
        if self._db is not None:
            await self._db.connection.aclose()
