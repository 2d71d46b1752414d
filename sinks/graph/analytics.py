"""Read-only queries for agents and dashboards: incidents, repros, verdicts and the topology, on FalkorDB.

Every statement here is sent with ``GRAPH.RO_QUERY`` (the server refuses a write in it), with a server-side timeout,
and every untrusted value is a Cypher parameter. :class:`GraphReader` is the one client of these statements (an
agent's own Cypher has its own bounded client, ``streamer.mcp.cypher``). The write statements stay in
:mod:`sinks.graph.schema`; nothing here writes.
"""

from __future__ import annotations

import contextlib
from typing import Any

from falkordb.asyncio import FalkorDB

from sinks.graph.endpoint import Endpoint

# ---- incidents ------------------------------------------------------------------------------------------------

# Incidents, regressions and findings of every registered type (``Incident:Finding``, its ``class`` is its type).
INCIDENTS = (
    "MATCH (i:Incident) WHERE ($anomaly IS NULL OR i.class = $anomaly) AND ($state IS NULL OR i.status = $state) "
    "AND ($since IS NULL OR i.last_seen >= $since) "
    "OPTIONAL MATCH (i)-[:ON]->(on) OPTIONAL MATCH (i)-[:CULPRIT|VICTIM]->(s:Span) "
    "WITH i, collect(DISTINCT coalesce(on.key, on.name)) AS targets, "
    "collect(DISTINCT s.service) + collect(DISTINCT on.service) + collect(DISTINCT i.service) AS svcs "
    "WHERE $service IS NULL OR $service IN svcs "
    "RETURN i.fingerprint, i.class, i.severity, i.status, i.summary, i.first_seen, i.last_seen, i.occurrences, "
    "targets, svcs ORDER BY i.last_seen DESC LIMIT $limit"
)
INCIDENT = (
    "MATCH (i:Incident {fingerprint: $fp}) OPTIONAL MATCH (i)-[:ON]->(on) "
    "RETURN i.fingerprint, i.class, i.severity, i.status, i.summary, i.first_seen, i.last_seen, i.occurrences, "
    "i.table, i.window_ms, i.metric, i.signature, collect(DISTINCT coalesce(on.key, on.name)), "
    "i.type, i.title, i.remedy, i.service, i.operation, i.entity, i.data, i.evidence, i.traces, i.contract"
)
OCCURRENCES = (
    "MATCH (o:Occurrence)-[:OF]->(:Incident {fingerprint: $fp}) "
    "RETURN o.id, o.at, o.entity, o.manifest, o.writers, o.version, o.commit, o.window, o.p_adjusted, o.traces "
    "ORDER BY o.at DESC LIMIT $limit"
)
# The accesses of the culprit's and the victim's traces to the incident's rows, with the commits credited to them.
TIMELINE = (
    "MATCH (i:Incident {fingerprint: $fp})-[r:CULPRIT|VICTIM]->(s:Span) "
    "MATCH (i)-[:ON]->(e:Entity)<-[a:READ|WROTE|PREDICATE]-(x:Span) WHERE x.trace = s.trace "
    "RETURN DISTINCT type(r), x.trace, x.service, x.id, type(a), a.at, a.lock, a.op, a.function, a.commit_ms, "
    "e.key, x.statement ORDER BY a.at LIMIT $limit"
)
# A party's span is usually the database client span: its code site is on its access edge and its route on the
# trace's root.
PARTIES = (
    "MATCH (i:Incident {fingerprint: $fp})-[r:CULPRIT|VICTIM]->(s:Span) "
    "OPTIONAL MATCH (s)-[:OF]->(t:Trace) OPTIONAL MATCH (s)-[x:READ|WROTE|PREDICATE]->(:Entity) "
    "WITH r, s, t, [f IN collect(x.function) WHERE f <> ''] AS sites "
    "RETURN type(r), s.id, s.trace, s.service, s.version, "
    "CASE WHEN s.function <> '' THEN s.function ELSE head(sites) END, "
    "CASE WHEN s.route <> '' THEN s.route ELSE t.root END ORDER BY type(r), s.id"
)
REPRO = (
    "MATCH (r:Repro)-[:PROVES]->(:Incident {fingerprint: $fp}) "
    "RETURN r.path, r.status, r.level, r.faithful, r.red, r.green ORDER BY r.path"
)
REPAIRS = (
    "MATCH (p:Repair)-[:FIXES]->(:Incident {fingerprint: $fp}) RETURN p.strategy, p.file, p.function, "
    "p.lock_before, p.lock_after, p.statement_before, p.statement_after ORDER BY p.file, p.function"
)
CONTRACTS_OF = (
    "MATCH (c:Contract)-[:FOR]->(:Incident {fingerprint: $fp}) OPTIONAL MATCH (v:Verdict)-[:JUDGES]->(c) "
    "RETURN c.signature, c.service, c.version, c.issue, collect(v.outcome + ' @ ' + v.version)"
)
VERDICTS = (
    "MATCH (v:Verdict)-[:JUDGES]->(c:Contract) OPTIONAL MATCH (c)-[:FOR]->(i:Incident) "
    "WITH v, c, i WHERE ($service IS NULL OR v.service = $service) AND ($outcome IS NULL OR v.outcome = $outcome) "
    "AND ($fp IS NULL OR i.fingerprint = $fp) "
    "RETURN v.key, v.outcome, v.service, v.version, v.commit, v.rollback, v.reason, v.at, c.signature, i.fingerprint "
    "ORDER BY v.at DESC LIMIT $limit"
)
RECEIPT = (
    "MATCH (v:Verdict {key: $key})-[:JUDGES]->(c:Contract) "
    "RETURN v.outcome, v.service, v.version, v.commit, v.rollback, v.reason, v.receipt, c.signature, c.json"
)

# ---- topology ---------------------------------------------------------------------------------------------------

CALL_WINDOWS = (
    "MATCH ()-[c:CALLS]->() WITH DISTINCT c.window AS id MATCH (w:Window {id: id}) "
    "RETURN id, w.start, w.end ORDER BY w.end DESC LIMIT $limit"
)
WINDOW = "MATCH (w:Window {id: $id}) RETURN w.id, w.start, w.end"
CALLS_IN = (
    "MATCH (a:Service)-[c:CALLS]->(b:Service) WHERE c.window IN $windows "
    "RETURN a.name, b.name, sum(c.count), sum(c.errors), max(c.p50_ms), max(c.p95_ms)"
)
SERVICES = (
    "MATCH (s:Service) OPTIONAL MATCH (s)-[:EXPOSES]->(o:Operation) "
    "RETURN s.name, count(o), collect(o.name)[..$ops] ORDER BY s.name LIMIT $limit"
)
OPERATIONS_NAMED = "MATCH (o:Operation) WHERE o.key = $name OR o.name = $name RETURN o.key ORDER BY o.key LIMIT 20"
STATS_WINDOWS = (
    "MATCH (:Operation)-[x:STATS]->(w:Window) WITH DISTINCT w RETURN w.id, w.start, w.end ORDER BY w.end DESC "
    "LIMIT $limit"
)
# Per operation, version and window: the stored critical-path shares and the owned nanoseconds behind them.
OPERATION_STATS = (
    "MATCH (o:Operation {key: $op})-[x:STATS]->(w:Window) WHERE $since IS NULL OR w.start >= $since "
    "RETURN x.window, w.start, w.end, x.version, x.requests, x.errors, x.p95_ms, x.critical_path "
    "ORDER BY w.start DESC LIMIT $limit"
)
OPERATION_PATH_NS = (
    "MATCH (o:Operation {key: $op})-[x:STATS_PART]->(w:Window) WHERE $since IS NULL OR w.start >= $since "
    "RETURN x.version, min(w.start), sum(x.requests), collect(x.path_ns) ORDER BY min(w.start)"
)
WINDOW_PATHS = (
    "MATCH (o:Operation)-[x:STATS]->(w:Window) WHERE x.window IN $windows "
    "RETURN o.key, x.window, x.version, x.requests, x.p95_ms, x.critical_path ORDER BY x.p95_ms DESC LIMIT $limit"
)
ENTITY_TOUCHES = (
    "MATCH (e:Entity {key: $key})<-[a:READ|WROTE|PREDICATE]-(s:Span) "
    "RETURN s.service, coalesce(a.function, ''), type(a), count(*), count(DISTINCT s.trace) "
    "ORDER BY count(*) DESC LIMIT $limit"
)
ENTITY_ENTRIES = (
    "MATCH (e:Entity {key: $key})<-[:READ|WROTE|PREDICATE]-(s:Span) WITH DISTINCT s.trace AS tid "
    "MATCH (t:Trace {id: tid}) RETURN t.service, t.root, count(t) ORDER BY count(t) DESC LIMIT $limit"
)
ENTITY_INCIDENTS = (
    "MATCH (i:Incident)-[:ON]->(:Entity {key: $key}) RETURN i.fingerprint, i.class, i.status, i.occurrences "
    "ORDER BY i.last_seen DESC LIMIT $limit"
)
HOT_CANDIDATES = (
    "MATCH (e:Entity)<-[w:WROTE]-(s:Span) WHERE ($table IS NULL OR e.table = $table) "
    "AND ($since IS NULL OR w.at >= $since) "
    "WITH e, count(DISTINCT s.trace) AS writers, count(w) AS writes, collect(DISTINCT s.service)[..5] AS svcs "
    "OPTIONAL MATCH (i:Incident)-[:ON]->(e) "
    "RETURN e.key, e.table, writers, writes, svcs, count(i), sum(coalesce(i.occurrences, 0)) "
    "ORDER BY count(i) DESC, writers DESC, e.key LIMIT $limit"
)
WRITE_TIMES = (
    "UNWIND $keys AS k MATCH (e:Entity {key: k})<-[w:WROTE]-(s:Span) WHERE w.at IS NOT NULL "
    "AND ($since IS NULL OR w.at >= $since) RETURN k, s.trace, w.at ORDER BY w.at LIMIT $limit"
)


class GraphReader:
    """Read-only queries on one graph: ``GRAPH.RO_QUERY`` with a timeout, a connection opened on first use."""

    def __init__(self, url: str | Endpoint, graph: str, *, timeout_ms: int = 10_000) -> None:
        self.endpoint = url if isinstance(url, Endpoint) else Endpoint.parse(url)  # user, password and TLS honoured
        self.graph_name = graph
        self.timeout_ms = timeout_ms
        self._db: Any = None
        self._graph: Any = None

    async def _connect(self) -> Any:
        if self._graph is None:
            self._db = FalkorDB(**self.endpoint.client_kwargs(), socket_timeout=self.timeout_ms / 1000 + 5)
            self._graph = self._db.select_graph(self.graph_name)
        return self._graph

    async def rows(self, cypher: str, params: dict[str, Any] | None = None, *, timeout_ms: int | None = None
                   ) -> list[list[Any]]:  # fmt: skip
        """The rows of a read query (an empty graph reads as no rows)."""
        graph = await self._connect()
        try:
            result = await graph.ro_query(cypher, params or {}, timeout=timeout_ms or self.timeout_ms)
        except Exception as exc:
            if "empty key" in str(exc).lower() or "invalid graph operation on empty key" in str(exc).lower():
                return []  # the graph does not exist yet: nothing written
            raise
        return [list(r) for r in result.result_set]

    async def close(self) -> None:
        if self._db is not None:
            with contextlib.suppress(Exception):
                await self._db.connection.aclose()
        self._db = self._graph = None
