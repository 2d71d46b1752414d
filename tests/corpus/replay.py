"""Replays a recorded corpus fixture through both daemon stages in one process, on a fake clock.

A generalisation of ``tests/runtime/chain.py``'s ``Chain`` to recorded Kafka messages: any topics and partitions
(the fixture's spans topic and its Debezium topics, matched by the CDC pattern ``^corpus\\.public\\.[a-z_]+$``),
real offsets and timestamps. The messages go in timestamp order (each partition in offset order) in random small
batches to ``IngestStage``; the clock follows the message timestamps (plus a random arrival lag); stage 1's
internal messages go to ``EntityStage`` on the partition their key hashes to (watermarks to every partition), and
every batch is settled as the runner settles it (pins released after the batch). Then both stages go idle until
stage 2's event time has passed the last message by stage 1's window, trace gap and lateness plus ``IDLE_MARGIN_S``:
every trace and window has closed, every change has been credited and every row judged.

The configuration is the daemon's default: only the spans topic and the CDC pattern are set (no key columns, no
insert identity, no invariants): detection has to learn what it needs from the data.

``python -m tests.corpus.replay`` prints what each fixture yields today, round by round.
"""

from __future__ import annotations

import heapq
import json
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.corpus.apps import SCENARIOS
from bench.corpus.manifest import Manifest, RoundRecord
from bench.corpus.recorder import CDC_PATTERN, Message
from processors.model.events import Access
from streamer import config
from streamer.components import default
from streamer.config import CoreSettings
from streamer.decode import internal as internal_codec
from streamer.decode.registry import Record
from streamer.runtime.context import stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from tests.corpus.expectations import judge_round, stray_incidents
from tests.fake_clock import FakeClock

FIXTURES = Path(__file__).with_name("fixtures")
MS = 1_000_000
S = 1_000_000_000
IDLE_STEP_S = 0.5
IDLE_MARGIN_S = 30.0  # beyond stage 1's longest window: stage 2's causal window, settle time and credit wait, amply
MAX_IDLE_STEPS = 10_000


@dataclass(frozen=True)
class Fixture:
    manifest: Manifest
    messages: list[Message]

    @property
    def scenario(self) -> str:
        return self.manifest.scenario

    def round(self, number: int) -> RoundRecord:
        return next(r for r in self.manifest.rounds if r.number == number)

    @classmethod
    def load(cls, scenario: str, directory: Path = FIXTURES) -> Fixture:
        manifest = Manifest.load(directory / f"{scenario}.manifest.json")
        lines = (directory / f"{scenario}.jsonl").read_text(encoding="utf-8").splitlines()
        return cls(manifest, [Message.from_json(line) for line in lines if line.strip()])


def recorded_scenarios(directory: Path = FIXTURES) -> list[str]:
    """The scenarios with a fixture, in the corpus's order."""
    return [name for name in SCENARIOS if (directory / f"{name}.manifest.json").exists()]


@dataclass
class Replayed:
    """What both stages produced from a fixture."""

    incidents: list[dict[str, Any]] = field(default_factory=list)  # stage 2's `incident` events, as JSON
    events: list[dict[str, Any]] = field(default_factory=list)  # every event either stage emitted, as JSON
    accesses: list[Access] = field(default_factory=list)  # stage 1's row accesses
    changes: list[dict[str, Any]] = field(default_factory=list)  # stage 2's row-change graph rows (credited)
    dead_letters: list[tuple[str, str]] = field(default_factory=list)  # (source topic, reason)
    committable: bool = False  # every input position of both stages committable at the end: no pin left behind

    def trace_of_span(self) -> dict[str, str]:
        return {a.span_id: a.trace_id for a in self.accesses}

    def credits(self) -> dict[int, str]:
        """lsn -> trace id of the access stage 2 credited the change to (credited changes only)."""
        traces = self.trace_of_span()
        return {c["lsn"]: traces.get(c["span"], "?") for c in self.changes if c["span"]}


def settings_for(manifest: Manifest, env: dict[str, str] | None = None) -> CoreSettings:
    """The daemon's default configuration with the fixture's topics."""
    base = {"TRACE_REPRO_KAFKA__SPANS_TOPIC": manifest.spans_topic, "TRACE_REPRO_KAFKA__CDC_PATTERN": CDC_PATTERN}
    return config.load(None, env={**base, **(env or {})})


def in_time_order(messages: Sequence[Message]) -> Iterator[Message]:
    """By timestamp across partitions, each partition in offset order (as a consumer could deliver them)."""
    by_tp: dict[tuple[str, int], list[Message]] = {}
    for m in sorted(messages, key=lambda m: m.offset):
        by_tp.setdefault((m.topic, m.partition), []).append(m)
    heads = [(ms[0].timestamp_ms, tp, 0) for tp, ms in by_tp.items()]
    heapq.heapify(heads)
    while heads:
        _, tp, i = heapq.heappop(heads)
        yield by_tp[tp][i]
        if i + 1 < len(by_tp[tp]):
            heapq.heappush(heads, (by_tp[tp][i + 1].timestamp_ms, tp, i + 1))


class Replay:
    """Stage 1 and stage 2 wired in process; see the module docstring."""

    def __init__(self, settings: CoreSettings, input_partitions: Sequence[tuple[str, int]], start_ns: int) -> None:
        self.settings = settings
        self.clock = FakeClock(start_ns)
        metrics = Metrics()
        factories = default().factories
        t1, t2 = PinTracker(), PinTracker()
        self.ingest = IngestStage(settings, metrics, self.clock, tracker=t1,
                                  processors=stage_processors(settings, metrics, self.clock, "ingest", t1,
                                                              factories))  # fmt: skip
        self.entities = EntityStage(settings, metrics, self.clock, tracker=t2,
                                    processors=stage_processors(settings, metrics, self.clock, "entities", t2,
                                                                factories))  # fmt: skip
        self.partitions = settings.kafka.accesses_partitions
        self.ingest.broadcast_partitions = self.partitions
        self.ingest.assign(input_partitions)
        self.entities.assign((settings.kafka.accesses_topic, p) for p in range(self.partitions))
        self.positions: dict[tuple[str, int], int] = {}  # next offset per input partition of either stage
        self.internal_offsets: dict[int, int] = {}
        self.out = Replayed()

    def run(self, messages: Sequence[Message], rnd: random.Random) -> Replayed:
        """Feed ``messages`` in time order, in random batches of 1-6, the clock following them; then go idle."""
        queue = list(in_time_order(messages))
        while queue:
            size = rnd.randint(1, 6)
            batch, queue = queue[:size], queue[size:]
            arrival = batch[-1].timestamp_ms * MS + rnd.randint(0, 300) * MS  # arrival lags the producer's time
            self.clock.now = max(self.clock.now, arrival)
            self._step([Record(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp_ms) for m in batch])
            for m in batch:
                self.positions[(m.topic, m.partition)] = m.offset + 1
        w = self.settings.windows
        horizon_s = w.window_s + w.trace_gap_s + w.allowed_lateness_s + IDLE_MARGIN_S
        newest = max((m.timestamp_ms * MS for m in messages), default=self.clock.now)
        for _ in range(MAX_IDLE_STEPS):
            if self.entities.event_time() >= newest + int(horizon_s * S):
                break
            self.clock.advance(IDLE_STEP_S)
            self._step([])
        self.out.committable = all(
            stage.committable(tp, end) == end
            for stage, tps in ((self.ingest, self.ingest.assignment), (self.entities, self.entities.assignment))
            for tp, end in self.positions.items()
            if tp in tps
        )
        return self.out

    def _step(self, records: list[Record]) -> None:
        out = self.ingest.process(records)
        self.ingest.release(out.release)
        self.out.events += [json.loads(e.model_dump_json()) for e in out.events]
        internal: list[Record] = []
        for m in out.produce:
            if m.topic == self.settings.kafka.dlq_topic:
                headers = dict(m.headers or ())
                self.out.dead_letters.append((headers.get("source.topic", b"").decode(),
                                              headers.get("reason", b"").decode()))  # fmt: skip
                continue
            if m.topic != self.settings.kafka.accesses_topic:
                continue
            self.out.accesses += [e for e in internal_codec.decode_all(m.value or b"") if isinstance(e, Access)]
            # a keyed message goes where the producer's partitioner sends it: where its row's packed accesses are
            partitions = [
                m.partition if m.partition is not None else internal_codec.partition_of(m.key or b"", self.partitions)
            ]
            for p in partitions:
                offset = self.internal_offsets.get(p, 0)
                self.internal_offsets[p] = offset + 1
                internal.append(Record(m.topic, p, offset, m.key, m.value, self.clock.now // MS))
                self.positions[(m.topic, p)] = offset + 1
        out2 = self.entities.process(internal)
        self.entities.release(out2.release)
        self.out.changes += out2.graph.changes
        for published in out2.events:
            doc = json.loads(published.model_dump_json())
            self.out.events.append(doc)
            if doc.get("kind") == "incident":
                self.out.incidents.append(doc)


def replay(fixture: Fixture, *, seed: int = 0, env: dict[str, str] | None = None) -> Replayed:
    """Both stages over ``fixture``, batched by ``random.Random(seed)``; see the module docstring."""
    messages = fixture.messages
    tps = sorted({(m.topic, m.partition) for m in messages})
    start = min((m.timestamp_ms for m in messages), default=0) * MS
    return Replay(settings_for(fixture.manifest, env), tps, start).run(messages, random.Random(seed))


def _summary(incident: dict[str, Any]) -> str:
    c, v = incident["culprit"], incident["victim"]
    return (f"{incident['anomaly']} on {incident['entity']}: culprit {c['function']} ({c['trace_id'][:8]}), "
            f"victim {v['function']} ({v['trace_id'][:8]})")  # fmt: skip


def report(scenarios: Sequence[str]) -> int:
    """Print, per fixture, what today's daemon finds and how each round fares; returns the number of failures."""
    failures = 0
    for name in scenarios:
        fixture = Fixture.load(name)
        result = replay(fixture)
        traces = {a.trace_id for a in result.accesses}
        print(f"== {name}: {len(fixture.messages)} messages, {len(result.accesses)} accesses of {len(traces)} traces, "
              f"{len(result.changes)} row changes ({sum(1 for c in result.changes if c['span'])} credited), "
              f"{len(result.dead_letters)} dead letters, {len(result.incidents)} incident(s)")  # fmt: skip
        for incident in result.incidents:
            print(f"   incident: {_summary(incident)}")
        for rnd in fixture.manifest.rounds:
            problems = judge_round(rnd, result.incidents)
            failures += bool(problems)
            print(f"   round {rnd.number} {rnd.kind:<28} {'ok' if not problems else 'FAIL: ' + '; '.join(problems)}")
        for stray in stray_incidents(fixture.manifest.rounds, result.incidents):
            failures += 1
            print(f"   FAIL stray incident: {_summary(stray)}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if report(sys.argv[1:] or recorded_scenarios()) else 0)
