"""Incidents out: the graph (Incident, Occurrence, ON, CULPRIT, VICTIM) and the ``trace-repro.incidents`` topic.

Effectively-once per occurrence: an occurrence already in the graph was published before, so it is not published
again (a replay after a crash or a restart from offset 0 re-detects it and stops here). A new occurrence is
published first and written second, so a crash in between publishes it once more on replay (at-least-once,
deduplicable by ``occurrence``) but never loses it. Repeated occurrences of a defect count up on its one
``Incident`` node (``occurrences``); the fingerprint never changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import structlog

from processors.incidents import incident_row
from sinks.falkordb_graph import GraphWriter
from streamer.schemas import IncidentEvent

log = structlog.get_logger("trace_repro.incidents")

KNOWN = "UNWIND $ids AS id MATCH (o:Occurrence {id: id}) RETURN o.id"
UPSERT = """
UNWIND $rows AS r
MERGE (i:Incident {fingerprint: r.fingerprint})
  ON CREATE SET i.status = 'open', i.first_seen = r.at
SET i.class = r.anomaly, i.table = r.table, i.window_ms = r.window_ms, i.last_seen = r.at,
    i.summary = r.summary,
    i.severity = CASE WHEN i.severity = 'high' OR r.severity = 'high' THEN 'high' ELSE 'low' END
MERGE (o:Occurrence {id: r.occurrence})
  ON CREATE SET o.entity = r.entity, o.at = r.at, o.manifest = r.manifest, o.writers = r.writers
MERGE (o)-[:OF]->(i)
MERGE (e:Entity {key: r.entity})
MERGE (i)-[:ON]->(e)
MERGE (c:Span {id: r.culprit})
MERGE (v:Span {id: r.victim})
MERGE (i)-[:CULPRIT]->(c)
MERGE (i)-[:VICTIM]->(v)
WITH DISTINCT i
MATCH (x:Occurrence)-[:OF]->(i)
WITH i, count(x) AS n
SET i.occurrences = n
"""

Publish = Callable[[str, bytes, bytes], Awaitable[None]]


class IncidentSink:
    def __init__(self, writer: GraphWriter, publish: Publish, topic: str) -> None:
        self.writer = writer
        self.publish = publish
        self.topic = topic
        self.published = 0

    async def handle(self, events: Sequence[IncidentEvent]) -> list[IncidentEvent]:
        """Publish and record the occurrences not seen before; returns those."""
        if not events:
            return []
        known = {row[0] for row in await self.writer.query(KNOWN, {"ids": [e.occurrence for e in events]})}
        fresh = [e for e in events if e.occurrence not in known]
        for e in fresh:
            await self.publish(self.topic, e.fingerprint.encode(), e.model_dump_json().encode())
            log.info("incident", fingerprint=e.fingerprint, anomaly=e.anomaly, severity=e.severity,
                     entity=e.entity, summary=e.summary)  # fmt: skip
        if fresh:
            await self.writer.query(UPSERT, {"rows": [incident_row(e) for e in fresh]})
        self.published += len(fresh)
        return fresh
