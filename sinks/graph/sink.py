"""The graph sink: the stages' rows, the published events, and the named queries of components.

It is the one component that talks to FalkorDB (through :class:`~sinks.graph.writer.GraphWriter`, which retries and
isolates refused rows). The runtime writes each batch's rows with :meth:`GraphSink.write_batch`; for the events a
batch publishes it :meth:`GraphSink.claim` s their ids (a replay re-derives events already published, and during a
rebalance two instances can derive the same event at once: the claim is one statement, so one of them wins),
publishes the ones it claimed, keeping the claims (:meth:`GraphSink.holding`), then :meth:`GraphSink.record` s
them: publish first, record second, so a crash in between publishes an event once more (at-least-once,
deduplicable by ``event_id``) but never loses it.

A row FalkorDB refuses for its content is isolated by the writer and handed to the caller's ``dead`` list, which the
runtime dead-letters before it commits. Windowed totals are summed from every replica's contributions and written
only if those contributions are still the ones summed (:data:`schema.CALLS_TOTAL`): replicas add up. Retention
(:meth:`GraphSink.expire_spans`) applies every rule of :data:`schema.EXPIRE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog

from processors.api.sink import Sink
from processors.api.telemetry import Telemetry
from processors.graph.rows import GraphPolicyConfig
from processors.lib.parts import calls_total, stats_total
from processors.model.base import Published
from processors.model.contract import ProofContract
from processors.model.graph import GraphBatch, Row
from processors.model.repro import ReproEvent
from sinks.graph import schema
from sinks.graph.records import published_row, repro_params, rows_by_kind
from sinks.graph.rows import DeadRow
from sinks.graph.writer import GraphWriter

log = structlog.get_logger("trace_repro.graph")

# A part's latency sketch comes back as one JSON text, ``[bins, bin_counts]`` (integers, which FalkorDB's toJSON
# writes exactly): a few hundred numbers per part read as one string, not one RESP line each (the Python RESP parser
# is slow at reading many short lines back).
_SKETCH = "sketch"
_CALLS_FIELDS = ("stamp", "count", "errors", _SKETCH, "min", "max")
_STATS_FIELDS = ("stamp", "revision", "requests", "errors", "signatures", "path_ns", _SKETCH, "min", "max")
Key = tuple[str, str, str]
TOTALS_ROUNDS = 100  # reads and sums of one batch's totals while other replicas keep changing their contributions
FIRST_CLAIM_WAIT_S = 0.02  # the first wait before looking again at ids another instance claimed (then doubled)
LONGEST_CLAIM_WAIT_S = 1.0


def instance_id() -> str:
    """This process, as the claims it makes name it: host, pid and a random part (a pid is reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _calls_row(key: Key, parts: list[dict[str, Any]]) -> Row:
    return {"caller": key[0], "callee": key[1], "window": key[2], **calls_total(parts)}


def _stats_row(key: Key, parts: list[dict[str, Any]]) -> Row:
    return {"operation_key": key[0], "window": key[1], "version": key[2], **stats_total(parts)}


_CALLS_KEY = ("caller", "callee", "window")
_STATS_KEY = ("operation_key", "window", "version")


class GraphSink(Sink):
    """See the module docstring."""

    name = "graph"

    def __init__(self, writer: GraphWriter, *, clock_ms: Callable[[], float], telemetry: Telemetry | None = None,
                 retention: GraphPolicyConfig | None = None, lease_s: float = 30.0,
                 owner: str | None = None) -> None:  # fmt: skip
        self.writer = writer
        self.owner = owner or instance_id()
        self.lease_ms = lease_s * 1000
        self._clock_ms = clock_ms
        self.telemetry = telemetry or writer.telemetry
        writer.telemetry = self.telemetry  # the writer's counts (unknown errors, rows trimmed) are the sink's
        self.retention = retention or GraphPolicyConfig()
        self._buffer: list[Published] = []

    async def start(self) -> None:
        """Create the schema and wait until every index is usable."""
        await self.writer.bootstrap()

    # ---- what the stages write --------------------------------------------------------------------------------

    async def write_batch(self, batch: GraphBatch, dead: list[DeadRow] | None = None) -> int:
        """Every row of ``batch``, the totals of the windowed aggregates it contributed to, then the events it asks
        to record; returns the rows written. Rows refused for their content go to ``dead``."""
        written = await self.writer.write(batch, dead)
        if batch.calls:
            written += await self._totals(schema.CALLS_PARTS, schema.CALLS_TOTAL, "calls_total",
                                          {(r["caller"], r["callee"], r["window"]) for r in batch.calls},
                                          _CALLS_FIELDS, _calls_row, _CALLS_KEY, dead)  # fmt: skip
        if batch.stats:
            written += await self._totals(schema.STATS_PARTS, schema.STATS_TOTAL, "stats_total",
                                          {(r["operation_key"], r["window"], r["version"]) for r in batch.stats},
                                          _STATS_FIELDS, _stats_row, _STATS_KEY, dead)  # fmt: skip
        if batch.records:
            await self.record(batch.records, dead)
        return written

    async def _totals(self, parts_query: str, total_upsert: str, name: str, keys: set[Key], fields: tuple[str, ...],
                      make: Callable[[Key, list[dict[str, Any]]], Row], key_of: tuple[str, str, str],
                      dead: list[DeadRow] | None) -> int:  # fmt: skip
        """Read every contribution of the window keys just written (this replica's and the others'), sum them, and
        write each total if its contributions are still those (see :data:`schema.CALLS_TOTAL`); the keys whose
        contributions changed meanwhile are read and summed again."""
        written = 0
        pending = sorted(keys)
        for _ in range(TOTALS_ROUNDS):
            if not pending:
                return written
            rows = await self.writer.query(parts_query, {"keys": [list(k) for k in pending]})
            grouped: dict[Key, list[dict[str, Any]]] = {}
            for row in rows:
                part = dict(zip(fields, row[3:], strict=True))
                part["bins"], part["bin_counts"] = json.loads(part.pop(_SKETCH))
                grouped.setdefault((row[0], row[1], row[2]), []).append(part)
            totals = [{**make(key, parts), "stamps": [p["stamp"] for p in parts]}
                      for key, parts in sorted(grouped.items())]  # fmt: skip
            applied: list[list[Any]] = []
            refused: list[DeadRow] = []
            await self.writer.write_rows(name, total_upsert, totals, refused, applied)
            written += len(applied)
            if dead is not None:
                dead.extend(refused)
            done = {tuple(r) for r in applied} | {tuple(d.row[k] for k in key_of) for d in refused}
            pending = [key for key in grouped if key not in done]
            self.telemetry.count("totals_raced", len(pending))  # another replica changed a contribution meanwhile
        # Still changing: whoever changed them last reads them after its change and writes their total.
        log.warning("graph.totals_contended", op=name, keys=len(pending), rounds=TOTALS_ROUNDS)
        return written

    async def claim(self, events: Sequence[Published]) -> list[Published]:
        """The events this instance is to publish, in order: those whose id it claimed now (or had claimed, or took
        over from a claim left unrecorded past the lease), each once. An id another instance claimed is looked at
        again until that instance records it (dropped here) or its lease runs out (taken over); see
        :data:`schema.PUBLISHED_CLAIM`."""
        now = self._clock_ms()
        rows = {e.event_id: {"id": e.event_id, "kind": getattr(e, "kind", ""), "at": now} for e in events}
        mine: set[str] = set()
        wait = FIRST_CLAIM_WAIT_S
        while rows:
            params = {"rows": list(rows.values()), "owner": self.owner, "lease": self.lease_ms}
            held: dict[str, Any] = {}
            for event_id, done, claimed, stale in await self.writer.query(schema.PUBLISHED_CLAIM, params):
                if claimed:
                    mine.add(event_id)
                    if stale:
                        self.telemetry.count("claims_taken_over")
                        log.warning("graph.claim_taken_over", event_id=event_id, lease_s=self.lease_ms / 1000)
                elif not done:
                    held[event_id] = rows[event_id]
            rows = held
            if rows:  # claimed by another instance that has not recorded them yet
                self.telemetry.count("claims_waited", len(rows))
                self.writer.check_stopping("claim")
                await asyncio.sleep(wait)
                wait = min(wait * 2, LONGEST_CLAIM_WAIT_S)
        fresh = []
        for e in events:
            if e.event_id in mine:  # the first of its id
                mine.discard(e.event_id)
                fresh.append(e)
        self.telemetry.count("replayed_events", len(events) - len(fresh))
        return fresh

    @contextlib.asynccontextmanager
    async def holding(self, events: Sequence[Published]) -> AsyncIterator[None]:
        """Keep this instance's claims on ``events`` while the body publishes and records them: renewed every third
        of the lease, so that only an instance that stopped loses them, not one whose publish waits on a broker."""
        ids = [e.event_id for e in events]
        renewing = asyncio.create_task(self._renew(ids)) if ids else None
        try:
            yield
        finally:
            if renewing is not None:
                renewing.cancel()
                await asyncio.wait([renewing])  # its end, without taking a cancellation of the caller as its own

    async def _renew(self, ids: list[str]) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                await self.writer.query(schema.PUBLISHED_RENEW, {"ids": ids, "owner": self.owner})
                self.telemetry.count("claims_renewed", len(ids))
            except Exception as exc:  # the graph refused it: the claims may lapse, and be taken over, as before
                log.warning("graph.claim_renewal_failed", error=str(exc)[:200])

    async def unseen(self, events: Sequence[Published]) -> list[Published]:
        """The events not recorded before (nor twice in ``events``), in order."""
        if not events:
            return []
        ids = list(dict.fromkeys(e.event_id for e in events))
        known = {row[0] for row in await self.writer.query(schema.PUBLISHED_KNOWN, {"ids": ids})}
        fresh: list[Published] = []
        for e in events:
            if e.event_id not in known:
                known.add(e.event_id)
                fresh.append(e)
        self.telemetry.count("replayed_events", len(events) - len(fresh))
        return fresh

    async def record(self, events: Sequence[Published], dead: list[DeadRow] | None = None) -> None:
        """Each event's nodes and edges, and its ``Published`` id (rows refused for their content go to ``dead``)."""
        for kind, rows in rows_by_kind(list(events)).items():
            await self.writer.write_rows(kind, schema.RECORDS[kind], rows, dead)
        now = self._clock_ms()
        await self.writer.write_rows("published", schema.PUBLISHED_MARK, [published_row(e, now) for e in events], dead)
        self.telemetry.count("recorded_events", len(events))

    async def expire_spans(self, cutoff_ms: float) -> int:
        """Retention at the event time whose raw spans' cut-off is ``cutoff_ms``: every rule of
        :data:`schema.EXPIRE`, each horizon's cut-off its own retention before that event time; returns how many
        nodes and edges went."""
        retentions = self.retention.retentions_s()
        now_ms = cutoff_ms + retentions["spans"] * 1000
        deleted = await self.writer.expire({h: now_ms - s * 1000 for h, s in retentions.items()})
        for rule, n in deleted.items():
            self.telemetry.count(f"expired_{rule}", n)
        total = sum(deleted.values())
        if total:
            log.info("graph.expired", **{k: v for k, v in deleted.items() if v})
        return total

    # ---- Sink: events fed one by one (e.g. by a sink runner) ---------------------------------------------------

    async def write(self, event: Published) -> None:
        self._buffer.append(event)

    async def flush(self) -> None:
        events, self._buffer = self._buffer, []
        await self.record(await self.unseen(events))

    async def healthcheck(self) -> bool:
        """Ready, connected, and no write failing for long (MISCONF, an unknown error: see ``writer``)."""
        return self.writer.healthy()

    async def close(self) -> None:
        await self.writer.close()

    # ---- named queries (processors.api.component.GraphQueries)
    # --------------------------------------------------------

    async def stored_contracts(self) -> list[ProofContract]:
        """Contracts on the graph (automatic and CLI ones), oldest first, so that a restart keeps watching."""
        rows = await self.writer.query(schema.STORED_CONTRACTS)
        return [ProofContract.model_validate_json(r[0]) for r in rows if r[0]]

    async def repro_known(self, fingerprint: str) -> bool:
        return bool(await self.writer.query(schema.REPRO_KNOWN, {"fp": fingerprint}))

    async def table_sites(self, table: str) -> list[tuple[str, str, str, str, str]]:
        rows = await self.writer.query(schema.TABLE_SITES, {"table": table})
        return [(str(f), str(file or ""), str(statement or ""), str(lock or "none"), str(service or ""))
                for f, file, statement, lock, service in rows]  # fmt: skip

    async def record_repro(self, event: Published) -> list[tuple[str, str, str]]:
        if not isinstance(event, ReproEvent):
            raise TypeError(f"record_repro takes a ReproEvent, not {type(event).__name__}")
        await self.writer.query(schema.REPRO_UPSERT, repro_params(event))
        rows = await self.writer.query(schema.REPAIR_GOVERNANCE, {"fp": event.fingerprint})
        return [(str(f), str(before), str(after)) for f, before, after in rows]

    async def table_keys(self) -> list[tuple[str, list[str]]]:
        rows = await self.writer.query(schema.TABLE_KEYS)
        return [(str(name), [str(c) for c in key]) for name, key in rows if isinstance(key, list)]

    async def tallies_since(self, updated_ms: float) -> list[dict[str, Any]]:
        rows = await self.writer.query(schema.TALLIES_SINCE, {"since": updated_ms})
        fields = ("service", "version", "part", "revision", "first_ns", "last_ns", "settled_until", "json", "updated")
        return [dict(zip(fields, row, strict=True)) for row in rows]

    async def query(self, cypher: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
        """A read query for tests and tools (retried like writes)."""
        return await self.writer.query(cypher, params)
