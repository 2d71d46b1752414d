"""Transport-neutral records in and out of a stage, so that stages are testable without Kafka."""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.graph_rows import GraphBatch
from processors.pins import Source
from streamer.schemas import IncidentEvent


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0

    @property
    def source(self) -> Source:
        return ((self.topic, self.partition), self.offset)


@dataclass(frozen=True, slots=True)
class Outbound:
    """One message a stage wants produced."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(slots=True)
class StageOutput:
    """What one processed batch asks of the runtime, in commit order: graph write, produce, then release pins."""

    graph: GraphBatch = field(default_factory=GraphBatch)
    produce: list[Outbound] = field(default_factory=list)
    release: list[Source] = field(default_factory=list)
    expire_before_ms: float | None = None  # retention: raw spans older than this (event time) may go
    incidents: list[IncidentEvent] = field(default_factory=list)


def dead_letter(record: Record, dlq_topic: str, reason: str, message: str) -> Outbound:
    """The original bytes, untouched, with the reason and the source position in headers."""
    headers = (
        ("reason", reason.encode()),
        ("error", message[:1000].encode("utf-8", "replace")),
        ("source.topic", record.topic.encode()),
        ("source.partition", str(record.partition).encode()),
        ("source.offset", str(record.offset).encode()),
    )
    return Outbound(dlq_topic, record.key, record.value, headers)
