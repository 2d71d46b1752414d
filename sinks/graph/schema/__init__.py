"""All Cypher of trace-repro: indexes, constraints, every upsert and every query, in one place.

Every write is ``UNWIND $rows AS r MERGE ...`` on an indexed, unique key, so replaying input changes nothing (the
trace upserts, in :mod:`sinks.graph.schema.traces`, look a span up by its key and create it only when it is not there).
Rows come from ``processors.graph.rows`` (traces, spans, accesses, windows, changes), the regression detector's
statistics (``stats``) and, for published events, :mod:`sinks.graph.records`. Nothing outside this package writes
Cypher (tests and the bench read the graph with their own queries); the retention rules are in
:mod:`sinks.graph.schema.retention`.
"""

from __future__ import annotations

from processors.graph.rows import SPAN_COLUMNS
from sinks.graph.schema import traces
from sinks.graph.schema.retention import EXPIRE as EXPIRE
from sinks.graph.schema.traces import TRACE_COLUMNS as TRACE_COLUMNS

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
    ("Occurrence", "id"),
    ("Published", "id"),
    ("Repro", "path"),
    ("Repair", "key"),
    ("Contract", "signature"),
    ("Verdict", "key"),
    ("Tally", "key"),
    ("Tally", "updated"),
    ("Table", "name"),
    # retention (EXPIRE): the event time each rule deletes by
    ("Span", "seen"),
    ("Entity", "seen"),
    ("Window", "end"),
    ("Occurrence", "at"),
    ("Published", "at"),
)
# Relationship indexes (``CREATE INDEX FOR ()-[x:TYPE]-() ON (x.prop)``): retention of the windowed CALLS edges.
EDGE_INDEXES: tuple[tuple[str, str], ...] = (("CALLS_PART", "end"), ("CALLS", "end"))
UNIQUE: tuple[tuple[str, str], ...] = (
    ("Service", "name"),
    ("Operation", "key"),
    ("Trace", "id"),
    ("Span", "id"),
    ("Entity", "key"),
    ("Window", "id"),
    ("Incident", "fingerprint"),
    ("Published", "id"),
    ("Tally", "key"),
    ("Table", "name"),
)

INDEX_STATES = "CALL db.indexes() YIELD label, properties, status"
CONSTRAINT_STATES = "CALL db.constraints() YIELD type, label, properties, status"


def create_index(label: str, prop: str) -> str:
    """``CREATE INDEX`` for one (label, property) of :data:`INDEXES` or (type, property) of :data:`EDGE_INDEXES`
    (names are ours, never input)."""
    if (label, prop) in EDGE_INDEXES:
        return f"CREATE INDEX FOR ()-[x:{label}]-() ON (x.{prop})"
    if (label, prop) not in INDEXES:
        raise ValueError(f"not a schema index: {label}.{prop}")
    return f"CREATE INDEX FOR (n:{label}) ON (n.{prop})"


# ---- stage upserts: one per GraphBatch field (processors.model.graph.UPSERTS) ----------------------------------

# The last event time a node was touched at (retention deletes by it); a replay of older input never moves it back.
_NEWER = "(e.lsn IS NULL OR r.lsn >= e.lsn)"  # a change row at least as new as the entity's image (e.lsn last)
_SEEN_MAX = "{n}.seen = CASE WHEN {n}.seen IS NULL OR {at} > {n}.seen THEN {at} ELSE {n}.seen END"

# An access row names its span and its Entity: the Entity is merged (as the entity's first access creates it, whether
# or not its span is in the graph), then the edge is merged from the span.
_ENTITY = (
    f"UNWIND $rows AS r MERGE (e:Entity {{key: r.entity}}) SET e.table = r.table, {_SEEN_MAX.format(n='e', at='r.at')} "
    "WITH e, r MATCH (s:Span {id: r.span}) "
)

UPSERTS: dict[str, str] = {
    "services": f"UNWIND $rows AS r MERGE (s:Service {{name: r.name}}) SET {_SEEN_MAX.format(n='s', at='r.seen')}",
    "operations": (
        "UNWIND $rows AS r MERGE (o:Operation {key: r.key}) SET o.service = r.service, o.name = r.name, "
        f"{_SEEN_MAX.format(n='o', at='r.seen')} WITH o, r MATCH (s:Service {{name: r.service}}) "
        "MERGE (s)-[:EXPOSES]->(o)"
    ),
    **traces.UPSERTS,  # traces, late_traces: sinks.graph.schema.traces
    "spans": (
        "UNWIND $rows AS r MERGE (s:Span {id: r[0]}) SET "
        + ", ".join(f"s.{c} = r[{i}]" for i, c in enumerate(SPAN_COLUMNS) if c != "id")
        + " WITH s, r MATCH (t:Trace {id: r[1]}) MERGE (s)-[:OF]->(t)"
    ),
    "child_of": (
        "UNWIND $rows AS r MATCH (c:Span {id: r[0]}) OPTIONAL MATCH (p:Span {id: r[1]}) "
        + traces.AWAIT.format(parent="r[1]", node="p", child="c")
    ),
    "reads": (
        f"{_ENTITY}MERGE (s)-[x:READ]->(e) SET x.at = r.at, x.lock = r.lock, x.version = r.version, "
        "x.params = r.params, x.function = r.function, x.file = r.file, x.predicate = r.predicate, "
        "x.keying = r.keying"
    ),
    "writes": (
        f"{_ENTITY}MERGE (s)-[x:WROTE]->(e) SET x.at = r.at, x.lock = r.lock, x.op = r.op, x.params = r.params, "
        "x.function = r.function, x.file = r.file, x.predicate = r.predicate, x.keying = r.keying"
    ),
    # A statement that named no row by its key: an edge to the table's scope (``orders:*``) with its predicate.
    "predicates": (
        f"{_ENTITY}MERGE (s)-[x:PREDICATE]->(e) SET x.at = r.at, x.lock = r.lock, x.op = r.op, x.params = r.params, "
        "x.function = r.function, x.file = r.file, x.predicate = r.predicate, x.keying = r.keying"
    ),
    "windows": "UNWIND $rows AS r MERGE (w:Window {id: r.id}) SET w.start = r.start, w.end = r.end",
    # Windowed aggregates are stored as one contribution per input partition (idempotent under replays, additive
    # over replicas), each with its stamp (``sinks.graph.rows.stamp``); the graph sink then sums them into the
    # CALLS / STATS edges (CALLS_TOTAL, STATS_TOTAL).
    "calls": (
        "UNWIND $rows AS r MATCH (a:Service {name: r.caller}) MATCH (b:Service {name: r.callee}) "
        "MERGE (a)-[c:CALLS_PART {window: r.window, part: r.part}]->(b) "
        "SET c.count = r.count, c.errors = r.errors, c.bins = r.bins, c.bin_counts = r.bin_counts, c.n = r.n, "
        "c.min = r.min, c.max = r.max, c.end = r.end, c.stamp = r.stamp"
    ),
    # Committed row changes (stage 2): the entity's last image (that of the highest LSN: FalkorDB does not apply
    # one UNWIND's SETs on a node in row order, so a row's insert and update in one batch would leave either image;
    # and a replayed older change never overwrites a newer one); the WROTE edge gets the commit facts and the
    # strength of the correlation. MERGE on the Span creates a placeholder if stage 1 has not written it yet.
    "changes": (
        "UNWIND $rows AS r MERGE (e:Entity {key: r.entity}) "
        f"SET e.table = r.table, e.image = CASE WHEN {_NEWER} THEN coalesce(r.after, r.before) ELSE e.image END, "
        f"e.deleted = CASE WHEN {_NEWER} THEN r.op = 'd' ELSE e.deleted END, "
        f"e.lsn = CASE WHEN {_NEWER} THEN r.lsn ELSE e.lsn END, "
        f"{_SEEN_MAX.format(n='e', at='r.commit_ms')} WITH e, r WHERE r.span IS NOT NULL "
        "MERGE (s:Span {id: r.span}) ON CREATE SET s.seen = r.commit_ms MERGE (s)-[w:WROTE]->(e) "
        "SET w.lsn = r.lsn, w.tx = r.tx, w.commit_ms = r.commit_ms, w.before = r.before, w.after = r.after, "
        "w.correlation = r.strength, w.skew_ms = r.skew_ms"
    ),
    "stats": (
        "UNWIND $rows AS r "
        f"MERGE (s:Service {{name: r.service}}) SET {_SEEN_MAX.format(n='s', at='r.end')} "
        "MERGE (o:Operation {key: r.operation_key}) ON CREATE SET o.service = r.service, o.name = r.operation "
        f"SET {_SEEN_MAX.format(n='o', at='r.end')} "
        "MERGE (s)-[:EXPOSES]->(o) "
        "MERGE (w:Window {id: r.window}) ON CREATE SET w.start = r.start, w.end = r.end "
        "MERGE (o)-[x:STATS_PART {window: r.window, version: r.version, part: r.part}]->(w) "
        "SET x.revision = r.revision, x.requests = r.requests, x.errors = r.errors, x.signatures = r.signatures, "
        "x.path_ns = r.path_ns, x.bins = r.bins, x.bin_counts = r.bin_counts, x.n = r.n, x.min = r.min, x.max = r.max, "
        "x.stamp = r.stamp"
    ),
    # The proof judge's cumulative counts per (build, input partition): overwritten by their one writer, summed by
    # every reader (processors.connectors.proofs.judge), so replicas and restarts see all of a build's traffic.
    "tallies": (
        "UNWIND $rows AS r MERGE (t:Tally {key: r.key}) "
        "SET t.updated = CASE WHEN t.json = r.json AND t.settled_until = r.settled_until THEN t.updated "
        "ELSE r.updated END, "  # a replay writes the same counts: nothing changes, not even the time
        "t.service = r.service, t.version = r.version, t.part = r.part, t.revision = r.revision, "
        "t.first_ns = r.first_ns, t.last_ns = r.last_ns, t.settled_until = r.settled_until, t.json = r.json"
    ),
    # A table's key columns, as Debezium's message keys name them (stage 1 learns them; every instance loads them).
    "tables": "UNWIND $rows AS r MERGE (t:Table {name: r.name}) SET t.key = r.key",
}


# After every batch, for the traces it wrote: their spans that wait for a parent (it came in a later fragment, or on
# another replica after a rebalance) are linked to it if it is in the graph now. ``WITH t`` makes the plan start at
# the Trace index and walk its spans, instead of scanning every Span for the property.
ADOPT = (
    "UNWIND $rows AS id MATCH (t:Trace {id: id}) WITH t "
    "MATCH (t)<-[:OF]-(c:Span) WHERE c.awaiting_parent IS NOT NULL WITH c, c.awaiting_parent AS parent "
    "MATCH (p:Span {id: parent}) MERGE (c)-[:CHILD_OF]->(p) SET c.awaiting_parent = NULL"
)

TABLE_KEYS = "MATCH (t:Table) RETURN t.name, t.key"

TALLIES_SINCE = (
    "MATCH (t:Tally) WHERE t.updated >= $since "
    "RETURN t.service, t.version, t.part, t.revision, t.first_ns, t.last_ns, t.settled_until, t.json, t.updated"
)

# Totals of windowed aggregates, which replicas write concurrently: the sink reads every contribution of a window
# key with its stamp (*_PARTS), sums them, and writes the total with the stamps it summed (*_TOTAL). The total is
# written only if the key's contributions on the server are still exactly those (same stamps, none more, none
# fewer): one statement, so the check and the write are atomic (FalkorDB runs one write query at a time on a
# graph). A total written from contributions another replica has changed since is refused (the key is not in the
# result), and the sink reads and sums again; so the last total written always adds up every contribution there is.
_SAME_PARTS = "WHERE size(stamps) = size(r.stamps) AND all(s IN stamps WHERE s IN r.stamps) "
CALLS_PARTS = (
    "UNWIND $keys AS k MATCH (a:Service {name: k[0]})-[c:CALLS_PART {window: k[2]}]->(b:Service {name: k[1]}) "
    "RETURN k[0], k[1], k[2], coalesce(c.stamp, ''), c.count, c.errors, toJSON([c.bins, c.bin_counts]), c.min, c.max"
)
CALLS_TOTAL = (
    "UNWIND $rows AS r MATCH (a:Service {name: r.caller}) MATCH (b:Service {name: r.callee}) "
    "OPTIONAL MATCH (a)-[p:CALLS_PART {window: r.window}]->(b) "
    "WITH a, b, r, collect(coalesce(p.stamp, '')) AS stamps, max(p.end) AS end "
    f"{_SAME_PARTS}"
    "MERGE (a)-[c:CALLS {window: r.window}]->(b) "
    "SET c.count = r.count, c.errors = r.errors, c.p50_ms = r.p50_ms, c.p95_ms = r.p95_ms, c.end = end "
    "RETURN r.caller, r.callee, r.window"
)
STATS_PARTS = (
    "UNWIND $keys AS k MATCH (:Operation {key: k[0]})-[x:STATS_PART {window: k[1], version: k[2]}]->(:Window) "
    "RETURN k[0], k[1], k[2], coalesce(x.stamp, ''), x.revision, x.requests, x.errors, x.signatures, x.path_ns, "
    "toJSON([x.bins, x.bin_counts]), x.min, x.max"
)
STATS_TOTAL = (
    "UNWIND $rows AS r MATCH (o:Operation {key: r.operation_key}) MATCH (w:Window {id: r.window}) "
    "OPTIONAL MATCH (o)-[p:STATS_PART {window: r.window, version: r.version}]->(w) "
    f"WITH o, w, r, collect(coalesce(p.stamp, '')) AS stamps {_SAME_PARTS}"
    "MERGE (o)-[x:STATS {window: r.window, version: r.version}]->(w) "
    "SET x.revision = r.revision, x.requests = r.requests, x.errors = r.errors, x.error_rate = r.error_rate, "
    "x.p50_ms = r.p50_ms, x.p95_ms = r.p95_ms, x.p99_ms = r.p99_ms, x.signatures = r.signatures, "
    "x.critical_path = r.critical_path "
    "RETURN r.operation_key, r.window, r.version"
)

# ---- published events (rows from sinks.graph.records) ---------------------------------------------------------

# Publishing claims each event's id first, in one statement: of two instances about to publish one event (a
# rebalance hands a partition over while its old owner is still judging it) MERGE creates the node for exactly one;
# the other finds it claimed and waits for it to be recorded (``done``). A claim neither recorded nor renewed within
# ``$lease`` ms of the graph's clock (its owner stopped between the claim and the record) passes to the next instance
# that claims it.
# A node without ``done`` was recorded before claims existed. Each row: id, recorded, claimed by ``$owner``, taken over.
PUBLISHED_CLAIM = (
    "UNWIND $rows AS r "
    "MERGE (p:Published {id: r.id}) "
    "ON CREATE SET p.kind = r.kind, p.at = r.at, p.done = false, p.owner = $owner, p.claimed = timestamp() "
    "WITH r, p, coalesce(p.done, true) AS done "
    "WITH r, p, done, NOT done AND p.owner <> $owner AND p.claimed < timestamp() - $lease AS stale "
    "SET p.owner = CASE WHEN stale THEN $owner ELSE p.owner END, "
    "p.claimed = CASE WHEN stale THEN timestamp() ELSE p.claimed END "
    "RETURN r.id, done, NOT done AND p.owner = $owner, stale"
)
# While its instance publishes them (a broker that is down makes that wait), its claims are renewed.
PUBLISHED_RENEW = (
    "UNWIND $ids AS id MATCH (p:Published {id: id}) WHERE p.owner = $owner AND NOT coalesce(p.done, true) "
    "SET p.claimed = timestamp()"
)
PUBLISHED_KNOWN = "UNWIND $ids AS id MATCH (p:Published {id: id}) WHERE coalesce(p.done, true) RETURN p.id"
PUBLISHED_MARK = (
    "UNWIND $rows AS r MERGE (p:Published {id: r.id}) ON CREATE SET p.kind = r.kind, p.at = r.at SET p.done = true"
)

# An incident's first and last sighting are the extremes of its occurrences' event times, whatever order they are
# written in (its node may exist already, from its contract or repro); an occurrence after the window a FIXED
# verdict judged reopens it (a replay of older ones does not).
_SEEN = (
    "SET i.first_seen = CASE WHEN i.first_seen IS NULL OR r.at < i.first_seen THEN r.at ELSE i.first_seen END, "
    "i.last_seen = CASE WHEN i.last_seen IS NULL OR r.at > i.last_seen THEN r.at ELSE i.last_seen END, "
    "i.status = CASE WHEN i.status IS NULL OR (i.status = 'fixed' AND r.at > i.fixed_at) THEN 'open' "
    "ELSE i.status END"
)

# An incident counts its occurrences, those retention deleted included (``expired_occurrences``).
_COUNT_OCCURRENCES = (
    "WITH DISTINCT i MATCH ({x}:Occurrence)-[:OF]->(i) WITH i, count({x}) AS n "
    "SET i.occurrences = n + coalesce(i.expired_occurrences, 0)"
)

RECORDS: dict[str, str] = {
    "incident": (
        "UNWIND $rows AS r "
        f"MERGE (i:Incident {{fingerprint: r.fingerprint}}) {_SEEN} "
        "SET i.class = r.anomaly, i.table = r.table, i.window_ms = r.window_ms, "
        "i.summary = r.summary, "
        "i.severity = CASE WHEN i.severity = 'high' OR r.severity = 'high' THEN 'high' ELSE 'low' END "
        "MERGE (o:Occurrence {id: r.occurrence}) "
        "ON CREATE SET o.entity = r.entity, o.at = r.at, o.manifest = r.manifest, o.writers = r.writers "
        "MERGE (o)-[:OF]->(i) "
        "MERGE (e:Entity {key: r.entity}) ON CREATE SET e.seen = r.at "
        "MERGE (i)-[:ON]->(e) "
        "MERGE (c:Span {id: r.culprit}) ON CREATE SET c.seen = r.at "
        "MERGE (v:Span {id: r.victim}) ON CREATE SET v.seen = r.at "
        "MERGE (i)-[:CULPRIT]->(c) "
        "MERGE (i)-[:VICTIM]->(v) "
        f"{_COUNT_OCCURRENCES.format(x='x')}"
    ),
    "regression": (
        "UNWIND $rows AS r "
        f"MERGE (i:Incident {{fingerprint: r.fingerprint}}) {_SEEN} "
        "SET i.class = 'regression', i.metric = r.metric, i.signature = r.signature, i.summary = r.summary, "
        "i.severity = 'high' "
        "MERGE (x:Occurrence {id: r.occurrence}) ON CREATE SET x.at = r.at, x.version = r.version, "
        "x.commit = r.commit, x.window = r.window, x.p_adjusted = r.p_adjusted "
        "MERGE (x)-[:OF]->(i) "
        "MERGE (o:Operation {key: r.operation_key}) ON CREATE SET o.service = r.service, o.name = r.operation, "
        "o.seen = r.at "
        "MERGE (i)-[:ON]->(o) "
        f"{_COUNT_OCCURRENCES.format(x='y')}"
    ),
    # A finding of any registered type is an Incident (contracts, verdicts, repros and the MCP tools find it by its
    # fingerprint) labelled Finding too; what it says of itself is the latest occurrence's.
    "finding": (
        "UNWIND $rows AS r "
        f"MERGE (i:Incident {{fingerprint: r.fingerprint}}) {_SEEN} "
        "SET i:Finding, i.class = r.type, i.type = r.type, "
        "i.severity = CASE WHEN i.severity = 'high' OR r.severity = 'high' THEN 'high' "
        "WHEN i.severity = 'medium' OR r.severity = 'medium' THEN 'medium' ELSE r.severity END "
        "WITH i, r, r.at >= i.last_seen AS latest "
        "SET i.title = CASE WHEN latest THEN r.title ELSE i.title END, "
        "i.summary = CASE WHEN latest THEN r.title ELSE i.summary END, "
        "i.remedy = CASE WHEN latest THEN r.remedy ELSE i.remedy END, "
        "i.service = r.service, i.operation = r.operation, "
        "i.entity = CASE WHEN latest THEN r.entity ELSE i.entity END, "
        "i.data = CASE WHEN latest THEN r.data ELSE i.data END, "
        "i.evidence = CASE WHEN latest THEN r.evidence ELSE i.evidence END, "
        "i.traces = CASE WHEN latest THEN r.traces ELSE i.traces END, "
        "i.contract = CASE WHEN r.contract IS NULL THEN i.contract ELSE r.contract END "
        "MERGE (x:Occurrence {id: r.occurrence}) ON CREATE SET x.at = r.at, x.version = r.version, "
        "x.entity = r.entity, x.data = r.data, x.traces = r.traces "
        "MERGE (x)-[:OF]->(i) "
        "FOREACH (_ IN CASE WHEN r.operation_key IS NULL THEN [] ELSE [1] END | "
        "MERGE (o:Operation {key: r.operation_key}) ON CREATE SET o.service = r.service, o.name = r.operation, "
        "o.seen = r.at MERGE (i)-[:ON]->(o)) "
        "FOREACH (_ IN CASE WHEN r.operation_key IS NULL AND r.service <> '' THEN [1] ELSE [] END | "
        "MERGE (s:Service {name: r.service}) ON CREATE SET s.seen = r.at MERGE (i)-[:ON]->(s)) "
        f"{_COUNT_OCCURRENCES.format(x='z')}"
    ),
    "verdict": (
        "UNWIND $rows AS r "
        "MERGE (v:Verdict {key: r.key}) "
        "SET v.outcome = r.outcome, v.service = r.service, v.version = r.version, v.commit = r.commit, "
        "v.rollback = r.rollback, v.reason = r.reason, v.receipt = r.receipt, v.at = r.at "
        "MERGE (c:Contract {signature: r.contract}) "
        "MERGE (v)-[:JUDGES]->(c) "
        # FIXED marks the incident fixed as of the judged window's end; NOT_FIXED / WORSE reopen it.
        "WITH r, c MATCH (c)-[:FOR]->(i:Incident) WHERE r.outcome IN ['FIXED', 'NOT_FIXED', 'WORSE'] "
        "AND (i.fixed_at IS NULL OR r.at >= i.fixed_at) "
        "SET i.status = CASE WHEN r.outcome = 'FIXED' THEN 'fixed' ELSE 'open' END, i.fixed_at = r.at"
    ),
    "contract": (
        "UNWIND $rows AS r "
        "MERGE (c:Contract {signature: r.signature}) "
        "SET c.fingerprint = r.fingerprint, c.must_start = r.must_start, c.watch_s = r.watch_s, "
        "c.min_requests = r.min_requests, c.alpha = r.alpha, c.baseline_rate = r.baseline_rate, "
        "c.service = r.service, c.version = r.version, c.issue = r.issue, c.created = r.created, c.json = r.json "
        "MERGE (i:Incident {fingerprint: r.fingerprint}) ON CREATE SET i.status = 'open' "
        "MERGE (c)-[:FOR]->(i)"
    ),
}

STORED_CONTRACTS = "MATCH (c:Contract) RETURN c.json ORDER BY c.created"

# ---- repros -----------------------------------------------------------------------------------------------------

REPRO_KNOWN = "MATCH (r:Repro)-[:PROVES]->(:Incident {fingerprint: $fp}) RETURN r.path LIMIT 1"
TABLE_SITES = (
    "MATCH (s:Span)-[x:READ|WROTE]->(e:Entity) WHERE e.table = $table AND x.function <> '' "
    "RETURN DISTINCT x.function, x.file, s.statement, x.lock, s.service"
)
REPRO_UPSERT = (
    "MERGE (i:Incident {fingerprint: $fp}) "
    "MERGE (r:Repro {path: $path}) "
    "SET r.status = $status, r.level = $level, r.faithful = $faithful, r.red = $red, r.green = $green "
    "MERGE (r)-[:PROVES]->(i) "
    "WITH i "
    "UNWIND $repairs AS x "
    "MERGE (p:Repair {key: x.key}) "
    "SET p.strategy = x.strategy, p.file = x.file, p.function = x.function, p.lock_before = x.lock_before, "
    "p.lock_after = x.lock_after, p.statement_before = x.statement_before, p.statement_after = x.statement_after "
    "MERGE (p)-[:FIXES]->(i)"
)
REPAIR_GOVERNANCE = (
    "MATCH (p:Repair)-[:FIXES]->(:Incident {fingerprint: $fp}) "
    "RETURN p.function, p.lock_before, p.lock_after ORDER BY p.function"
)
