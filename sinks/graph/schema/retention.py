"""The graph's retention rules: one Cypher statement per node label and relationship type, by event time."""

from __future__ import annotations

# ---- retention --------------------------------------------------------------------------------------------------
#
# Every node label and relationship type has a rule, by event time (ms): ``GraphWriter.expire`` runs :data:`EXPIRE`
# in this order, each statement with the cut-off of its horizon (event time now minus ``graph_policy``'s retention
# of that horizon), ``$limit`` deletions at a time. Edges go with the nodes they join unless a rule names them.
#
# horizon     kind                       rule, and why
# ----------  -------------------------  ----------------------------------------------------------------------------
# incidents   Incident, and what exists  an incident whose last occurrence, contracts' creation and verdicts are all
#             only for it: Occurrence,   before the cut-off goes, with its occurrences, the contracts FOR it and their
#             Contract, Verdict, Repro,  verdicts, its repros and repairs (and ON, CULPRIT, VICTIM, OF, FOR, JUDGES,
#             Repair                     PROVES, FIXES). A live contract (created or judging recently) keeps it.
#                                        The defect seen again later is a new incident, as a first sighting is.
# incidents   Occurrence                 before the cut-off, also of an incident that still occurs (a hot defect
#                                        would grow one node per occurrence for ever); the incident keeps counting it
#                                        (``expired_occurrences``), so ``occurrences`` never goes down.
# incidents   Verdict                    judged before the cut-off, also on a live contract (one per build judged).
# incidents   Contract with no incident  (a verdict recorded before its contract): created and judged before it.
# incidents   Tally                      a build's counts on one partition, its last request before the cut-off: the
#                                        judge compares a new build with the one before it, which served until the
#                                        deploy, and watches a build for ``proof.watch_s``: both far shorter.
# spans       Span                       ended before the cut-off (a placeholder a row change or an incident MERGEd
#                                        before its span came: first seen before it), with its CULPRIT / VICTIM edges:
#                                        an incident that keeps occurring names new spans each time, so pinning them
#                                        would grow with it; its occurrences keep their entity, writers and time.
# spans       Trace                      started before the cut-off, with no span left.
# spans       Entity                     last touched before the cut-off, with no access left (they went with their
#                                        spans), and its ON edges (the occurrences name the row).
# aggregates  CALLS_PART, CALLS          their window ended before the cut-off.
# aggregates  Window                     ended before the cut-off, with its STATS_PART and STATS.
# aggregates  Operation, Service         last seen before the cut-off and with no aggregate left (EXPOSES and ON go
#                                        with them): routes and services that no longer exist.
# published   Published                  recorded before the cut-off. It is how a replay recognises what it published
#                                        already, so the horizon must exceed the input topics' retention (a replay
#                                        from the earliest offset must still find it).
# (kept)      Table                      one per captured table, bounded by the database's schema, and read by every
#                                        instance to name rows: never expired.
#
# A graph written before these rules has nodes without the property a rule reads (Entity, Service and Operation
# ``seen``, CALLS ``end``): they are kept until stamped once, e.g. ``MATCH (e:Entity) WHERE e.seen IS NULL
# SET e.seen = timestamp()`` and ``MATCH ()-[c:CALLS|CALLS_PART]->() WHERE c.end IS NULL
# SET c.end = toFloat(split(c.window, '-')[1])``.

_DELETE_CASE = (  # the incidents given as ``i``: everything that exists only for them, then them
    "OPTIONAL MATCH (i)<-[:OF]-(o:Occurrence) WITH i, collect(o) AS os FOREACH (x IN os | DETACH DELETE x) "
    "WITH i OPTIONAL MATCH (i)<-[:PROVES|FIXES]-(r) WITH i, collect(r) AS rs FOREACH (x IN rs | DETACH DELETE x) "
    "WITH i OPTIONAL MATCH (i)<-[:FOR]-(c:Contract) OPTIONAL MATCH (c)<-[:JUDGES]-(v:Verdict) "
    "WITH i, collect(DISTINCT c) + collect(DISTINCT v) AS cs FOREACH (x IN cs | DETACH DELETE x) "
    "DETACH DELETE i RETURN count(i)"
)

EXPIRE: tuple[tuple[str, str, str], ...] = (  # (rule, horizon, statement): each returns how many it deleted
    ("incidents", "incidents",
     "MATCH (i:Incident) WHERE coalesce(i.last_seen, 0) < $cutoff "
     "OPTIONAL MATCH (c:Contract)-[:FOR]->(i) OPTIONAL MATCH (v:Verdict)-[:JUDGES]->(c) "
     "WITH i, max(coalesce(c.created, 0)) AS created, max(coalesce(v.at, 0)) AS judged "
     f"WHERE created < $cutoff AND judged < $cutoff WITH i LIMIT $limit {_DELETE_CASE}"),
    ("occurrences", "incidents",
     "MATCH (o:Occurrence) WHERE o.at < $cutoff WITH o LIMIT $limit OPTIONAL MATCH (o)-[:OF]->(i:Incident) "
     "WITH i, collect(o) AS os FOREACH (_ IN CASE WHEN i IS NULL THEN [] ELSE [1] END | "
     "SET i.expired_occurrences = coalesce(i.expired_occurrences, 0) + size(os)) "
     "FOREACH (x IN os | DETACH DELETE x) RETURN sum(size(os))"),
    ("verdicts", "incidents",
     "MATCH (v:Verdict) WHERE v.at < $cutoff WITH v LIMIT $limit DETACH DELETE v RETURN count(v)"),
    ("contracts", "incidents",
     "MATCH (c:Contract) WHERE coalesce(c.created, 0) < $cutoff AND NOT (c)-[:FOR]->() "
     "OPTIONAL MATCH (v:Verdict)-[:JUDGES]->(c) WITH c, max(coalesce(v.at, 0)) AS judged WHERE judged < $cutoff "
     "WITH c LIMIT $limit OPTIONAL MATCH (v:Verdict)-[:JUDGES]->(c) WITH c, collect(v) AS vs "
     "FOREACH (x IN vs | DETACH DELETE x) DETACH DELETE c RETURN count(c)"),
    ("tallies", "incidents",
     "MATCH (t:Tally) WHERE t.last_ns < $cutoff * 1000000 WITH t LIMIT $limit DELETE t RETURN count(t)"),
    ("spans", "spans",
     "MATCH (s:Span) WHERE s.end < $cutoff WITH s LIMIT $limit DETACH DELETE s RETURN count(s)"),
    ("placeholders", "spans",
     "MATCH (s:Span) WHERE s.seen < $cutoff AND s.end IS NULL WITH s LIMIT $limit DETACH DELETE s RETURN count(s)"),
    ("traces", "spans",
     "MATCH (t:Trace) WHERE t.start < $cutoff AND NOT (t)<-[:OF]-(:Span) "
     "WITH t LIMIT $limit DETACH DELETE t RETURN count(t)"),
    ("entities", "spans",
     "MATCH (e:Entity) WHERE e.seen < $cutoff AND NOT (e)<-[:READ|WROTE|PREDICATE]-() "
     "WITH e LIMIT $limit DETACH DELETE e RETURN count(e)"),
    ("calls_parts", "aggregates",
     "MATCH ()-[c:CALLS_PART]->() WHERE c.end < $cutoff WITH c LIMIT $limit DELETE c RETURN count(c)"),
    ("calls", "aggregates",
     "MATCH ()-[c:CALLS]->() WHERE c.end < $cutoff WITH c LIMIT $limit DELETE c RETURN count(c)"),
    ("windows", "aggregates",
     "MATCH (w:Window) WHERE w.end < $cutoff WITH w LIMIT $limit DETACH DELETE w RETURN count(w)"),
    ("operations", "aggregates",
     "MATCH (o:Operation) WHERE o.seen < $cutoff AND NOT (o)-[:STATS|STATS_PART]->() "
     "WITH o LIMIT $limit DETACH DELETE o RETURN count(o)"),
    ("services", "aggregates",
     "MATCH (s:Service) WHERE s.seen < $cutoff AND NOT (s)-[:EXPOSES]->() AND NOT (s)-[:CALLS|CALLS_PART]-() "
     "WITH s LIMIT $limit DELETE s RETURN count(s)"),
    ("published", "published",
     "MATCH (p:Published) WHERE p.at < $cutoff WITH p LIMIT $limit DELETE p RETURN count(p)"),
)  # fmt: skip
