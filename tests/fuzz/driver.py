"""Both stages in process on a fake clock (``tests.runtime.chain.Chain``), with every output kept for the properties.

``Run.step(records)`` is one batch of stage 1 and then one of stage 2 on what stage 1 sent to the internal topic,
settled as the runner settles a batch (pins released); ``Run.settle`` lets event time pass with no input, so that
traces close and rows are judged. What the properties read: dead letters by source position and reason, the
accesses and row changes stage 1 published, both stages' graph rows and incidents, and every component's drops.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from processors.model.events import Access, RowChange
from processors.model.graph import GraphBatch
from streamer import config
from streamer.components import default
from streamer.decode import internal as internal_codec
from streamer.decode.registry import Record
from streamer.runtime.context import stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import Message
from tests.fake_clock import FakeClock
from tests.runtime.chain import CDC, CHARGES_CDC, INTERNAL_PARTITIONS, INVENTORY_CDC, SPANS, T0, Chain, Found

OWNED = ((SPANS, 0), (CDC, 0), (CHARGES_CDC, 0), (INVENTORY_CDC, 0))
QUICK = {  # event time moves in a few steps; the fuzz is about content, not settings
    "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2",
    "TRACE_REPRO_WINDOWS__MAX_REQUEST_S": "2",  # a trace awaiting a parent that never comes closes within settle()
    "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": "0",
    "TRACE_REPRO_WINDOWS__IDLE_S": "0.3",
    "TRACE_REPRO_PROOF__SETTLE_S": "1",
    "TRACE_REPRO_WINDOWS__WINDOW_S": "2",
    "TRACE_REPRO_WINDOWS__MAX_CDC_LAG_S": "2",
    "TRACE_REPRO_COLLISIONS__INVARIANTS": json.dumps(
        {"inventory": ["stock >= 0"], "orders": ["amount >= 0 AND status IS NOT NULL", "NOT amount < -1"]}
    ),
}


@functools.cache
def _settings(env: tuple[tuple[str, str], ...]) -> config.Settings:
    return config.load(None, env={"TRACE_REPRO_KAFKA__CDC_PATTERN": r"^shop\.[^.]+\.[^.]+$", **dict(env)})


def _chain(env: tuple[tuple[str, str], ...]) -> Chain:
    """``Chain(env, owners=(OWNED,))`` with the settings loaded once per ``env`` (loading is most of a new chain's
    cost, and the long run makes 10⁵ of them)."""
    chain = Chain.__new__(Chain)
    chain.settings = _settings(env)
    chain.clock = FakeClock(T0)
    chain.metrics = Metrics()
    chain.workers = [chain.ingest_stage(OWNED)]
    chain.ingest = chain.workers[0]
    tracker = PinTracker()
    chain.entities = EntityStage(
        chain.settings,
        chain.metrics,
        chain.clock,
        tracker=tracker,
        processors=stage_processors(
            chain.settings, chain.metrics, chain.clock, "entities", tracker, default().factories
        ),
    )
    chain.offsets = {}
    chain.found = Found()
    return chain


@dataclass(frozen=True)
class DeadLetter:
    stage: str
    topic: str
    offset: int
    reason: str
    error: str


@dataclass
class Run:
    """A chain of both stages and everything they produced; see the module docstring."""

    env: dict[str, str]
    chain: Chain = field(init=False)
    dead: list[DeadLetter] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    changes: list[RowChange] = field(default_factory=list)
    graph: GraphBatch = field(default_factory=GraphBatch)  # stage 1's rows
    graph2: GraphBatch = field(default_factory=GraphBatch)  # stage 2's rows
    incidents: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.chain = _chain(tuple(sorted({**QUICK, **self.env}.items())))

    def record(self, topic: str, key: bytes | None, value: bytes | None) -> Record:
        return self.chain._record(topic, 0, key, value)

    def _dead(self, stage: str, messages: Sequence[Message]) -> None:
        dlq = self.chain.settings.kafka.dlq_topic
        for m in messages:
            if m.topic == dlq:
                h = {k: v.decode() for k, v in m.headers}
                self.dead.append(
                    DeadLetter(stage, h["source.topic"], int(h["source.offset"]), h["reason"], h.get("error", ""))
                )

    def step(self, records: Sequence[Record]) -> None:
        chain = self.chain
        out = chain.ingest.process(records)
        chain.ingest.release(out.release)
        self.graph.extend(out.graph)
        self._dead("ingest", out.produce)
        internal: list[Record] = []
        topic = chain.settings.kafka.accesses_topic
        for m in out.produce:
            if m.topic != topic:
                continue
            for event in internal_codec.decode_all(m.value or b""):  # stage 1 wrote it: stage 2 must read it
                if isinstance(event, Access):
                    self.accesses.append(event)
                elif isinstance(event, RowChange):
                    self.changes.append(event)
            # a keyed message goes where the producer's partitioner sends it: where its row's packed accesses are
            partitions = [
                m.partition
                if m.partition is not None
                else internal_codec.partition_of(m.key or b"", INTERNAL_PARTITIONS)
            ]
            internal += [chain._record(topic, p, m.key, m.value) for p in partitions]
        out2 = chain.entities.process(internal)
        chain.entities.release(out2.release)
        self.graph2.extend(out2.graph)
        self._dead("entities", out2.produce)
        self.incidents += [json.loads(e.model_dump_json()) for e in out2.events]

    def settle(self) -> None:
        """Input stops: traces close, rows are judged, windows and proof slices settle (20 s of event time)."""
        for step_s in (0.5,) * 8 + (4.0,) * 4:
            self.chain.clock.advance(step_s)
            self.step([])

    def processor_errors(self) -> dict[str, int]:
        """Hooks that raised (each counted against its processor by the stage): none may."""
        return {t.component: t.dropped["error"] for t in self.chain.metrics.telemetry.all() if t.dropped.get("error")}

    def dropped(self) -> dict[tuple[str, str], int]:
        return {(t.component, r): n for t in self.chain.metrics.telemetry.all() for r, n in t.dropped.items() if n}

    def dead_at(self, topic: str, offset: int) -> list[DeadLetter]:
        return [d for d in self.dead if d.stage == "ingest" and d.topic == topic and d.offset == offset]

    def traced(self) -> set[str]:
        """Trace ids with a Trace row (whole or late fragment) on the graph."""
        return {r["id"] for r in self.graph.traces + self.graph.late_traces}
