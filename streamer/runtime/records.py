"""What one processed batch asks of the runtime, transport-neutral so that stages are testable without Kafka."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from processors.model.base import Published
from processors.model.fast import maker
from processors.model.graph import GraphBatch
from processors.model.span import Span
from sinks.kafka.producer import Message
from streamer.decode.registry import Record
from streamer.runtime.pins import Source

__all__ = ["Message", "Record", "SpanRun", "StageOutput", "dead_letter", "new_record"]

# ``Record(...)`` for less (``processors.model.fast``): the runner makes one for every message it consumes.
new_record = maker(Record)


_graph_lists = operator.attrgetter(*(f.name for f in fields(GraphBatch)))  # every list of a GraphBatch, in order


@dataclass(slots=True)
class StageOutput:
    """In commit order: write ``graph``, produce ``produce``, publish the ``events`` this instance claims and record
    them, then release the pins in ``release`` (and commit what that allows)."""

    graph: GraphBatch = field(default_factory=GraphBatch)
    produce: list[Message] = field(default_factory=list)
    events: list[Published] = field(default_factory=list)
    release: list[Source] = field(default_factory=list)
    expire_before_ms: float | None = None  # retention: raw spans older than this (event time) may go

    def mark(self) -> tuple[int, ...]:
        """How much is in the output now (graph rows, messages, events), for :meth:`rollback` (taken before every
        closed trace: the graph's lists in one C call, not ``fields`` and a generator each time)."""
        return (*map(len, _graph_lists(self.graph)), len(self.produce), len(self.events))

    def rollback(self, mark: tuple[int, ...]) -> None:
        """Drop what was added since ``mark``: the rows and messages of a unit whose handling failed half-way
        (everything here is only ever appended to while a batch is processed)."""
        graph = self.graph
        *rows, produced, events = mark
        for listed, n in zip(_graph_lists(graph), rows, strict=True):
            del listed[n:]
        del self.produce[produced:]
        del self.events[events:]


def dead_letter(record: Record, dlq_topic: str, reason: str, message: str, component: str = "") -> Message:
    """The original bytes and headers, untouched, then the reason, the component that refused it and the source
    position as headers of the daemon's own (after the original ones: a reader taking the last header of a name gets
    the daemon's).

    The Kafka sink fits it to the dead-letter topic's ``max.message.bytes`` when it is sent: a copy too large is cut,
    with its original size (``truncated``) and digest (``original.sha256``) in headers (:mod:`sinks.kafka.sizing`).
    """
    headers = (
        *record.headers,
        ("reason", reason.encode()),
        ("component", component.encode("utf-8", "replace")),
        ("error", message[:1000].encode("utf-8", "replace")),
        ("source.topic", record.topic.encode("utf-8", "replace")),
        ("source.partition", str(record.partition).encode()),
        ("source.offset", str(record.offset).encode()),
    )
    return Message(dlq_topic, record.key, record.value, headers)


class SpanRun:
    """Consecutive span messages of one partition in a batch, assembled together by the ingest stage: their
    spans, bytes, and (latest end, spans) of each message."""

    __slots__ = ("bytes", "ends", "records", "spans", "tp")

    def __init__(self, first: Record) -> None:
        self.tp = (first.topic, first.partition)
        self.records: list[Record] = []
        self.spans: list[Span] = []
        self.bytes = 0
        self.ends: list[tuple[int, int]] = []

    def add(self, record: Record, spans: Sequence[Span]) -> None:
        self.records.append(record)
        self.spans.extend(spans)
        self.bytes += len(record.value or b"")
        n = len(spans)
        self.ends.append((spans[0].end_ns if n == 1 else max([s.end_ns for s in spans]), n))  # most: one span
