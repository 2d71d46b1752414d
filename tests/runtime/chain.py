"""Both stages in one process, wired as Kafka would wire them: stage 1's internal messages feed stage 2.

Inputs are real wire formats: OTLP ``TracesData`` built with the OpenTelemetry SDK, and Debezium JSON envelopes.
``Scenario`` plants collisions and background traffic with exact statement times; ``Chain`` runs them through
``IngestStage`` and ``EntityStage`` (with the default components) in random batches, on a fake clock, routing
stage 1's output to stage 2's partitions by key (watermarks to every partition) and settling every batch as the
runner would (release pins after the batch).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import SpanKind

from processors.model.events import Access
from streamer import config
from streamer.components import default
from streamer.decode import internal as internal_codec
from streamer.decode.registry import Record
from streamer.runtime.context import stage_processors
from streamer.runtime.entities import EntityStage
from streamer.runtime.ingest import IngestStage
from streamer.runtime.metrics import Metrics
from streamer.runtime.pins import PinTracker
from streamer.runtime.records import StageOutput
from streamer.runtime.stage import Stage
from tests.fake_clock import FakeClock
from tests.otlp_factory import ShopTelemetry, to_proto

S = 1_000_000_000
MS = 1_000_000
T0 = 1_800_000_000 * S
SPANS = "otlp_spans"
CDC = "shop.public.orders"
CHARGES_CDC = "shop.public.charges"
INVENTORY_CDC = "shop.public.inventory"
READ = "SELECT status FROM orders WHERE id = %s"
WRITE = "UPDATE orders SET status = %s WHERE id = %s"
CHARGE_READ = "SELECT id FROM charges WHERE order_id = %s"
CHARGE = "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id"
INTERNAL_PARTITIONS = 2


@dataclass
class Scenario:
    """Messages on the spans and CDC topics, and what detection must find in them."""

    spans: list[tuple[int, bytes]] = field(default_factory=list)  # (event time of the message, TracesData)
    changes: list[tuple[int, bytes, bytes, str]] = field(default_factory=list)  # (commit time, key, value, topic)
    collisions: set[tuple[str, str, str]] = field(default_factory=set)  # (entity, culprit fn, victim fn)
    credits: dict[int, str] = field(default_factory=dict)  # lsn -> code function of the writer
    shop: ShopTelemetry = field(default_factory=ShopTelemetry)
    lsn: int = 1_000
    charge_id: int = 500

    def _request(self, function: str, route: str, start_ns: int, statements: list[tuple[str, str, int, int]],
                 split_ns: int = 0) -> None:  # fmt: skip
        """One request: a server span, its handler, one DB span per (sql, params, start offset, duration); with
        ``split_ns``, its first statement's span is exported alone and the rest ``split_ns`` after the request."""
        tracer = self.shop.tracer
        end = start_ns + max(at + dur for _, _, at, dur in statements) + MS
        with tracer.start_as_current_span(f"POST {route}", kind=SpanKind.SERVER, start_time=start_ns,
                                          end_on_exit=False) as server:  # fmt: skip
            server.set_attribute("http.route", route)
            with tracer.start_as_current_span(function, start_time=start_ns, end_on_exit=False) as handler:
                handler.set_attribute("code.function.name", function)
                for sql, params, at, dur in statements:
                    db = tracer.start_span("db", kind=SpanKind.CLIENT, start_time=start_ns + at)
                    db.set_attribute("db.system.name", "postgresql")
                    db.set_attribute("db.query.text", sql)
                    db.set_attribute("db.statement.parameters", params)
                    db.end(end_time=start_ns + at + dur)
                handler.end(end_time=end)
            server.set_attribute("http.response.status_code", 200)
            server.end(end_time=end)
        spans = self.shop.take()
        if split_ns:
            first = min((x for x in spans if x.name == "db"), key=lambda x: x.start_time or 0)
            self.spans.append((first.end_time or end, to_proto([first])))
            self.spans.append((end + split_ns, to_proto([x for x in spans if x is not first])))
        else:
            self.spans.append((end, to_proto(spans)))

    def _change(self, row: int, before: str, after: str, commit_ns: int, writer: str) -> None:
        self._debezium("orders", {"id": row, "status": before}, {"id": row, "status": after}, commit_ns, writer)

    def _debezium(self, table: str, before: dict[str, Any] | None, after: dict[str, Any], commit_ns: int,
                  writer: str, key_column: str = "id") -> None:  # fmt: skip
        self.lsn += 8
        commit_ms = commit_ns // MS
        source = {
            "version": "3.6.1.Final",
            "connector": "postgresql",
            "name": "shop",
            "ts_ms": commit_ms,
            "db": "shop",
            "schema": "public",
            "table": table,
            "txId": self.lsn // 8,
            "lsn": self.lsn,
        }
        value = {"before": before, "after": after, "source": source, "op": "u" if before else "c",
                 "ts_ms": commit_ms + 50}  # fmt: skip
        key = json.dumps({key_column: after[key_column]}).encode()
        self.changes.append((commit_ns, key, json.dumps(value).encode(), f"shop.public.{table}"))
        self.credits[self.lsn] = writer

    def lost_update(self, row: int, at_ns: int, *, same_value: bool = False, split_ns: int = 0) -> None:
        """expire_cart and capture_payment both read the row, then both write it: the first write is lost.
        ``split_ns``: expire_cart's read is exported alone, the rest of its trace that much later."""
        b_value = "cancelled" if same_value else "paid"
        self._request("shop.jobs.expire_cart", "/jobs/expire", at_ns,
                      [(READ, f"({row},)", 0, MS), (WRITE, f"('cancelled', {row})", 10 * MS, MS)],
                      split_ns)  # fmt: skip
        self._request("shop.handlers.capture_payment", "/orders/{id}/capture", at_ns + 2 * MS,
                      [(READ, f"({row},)", 0, MS), (WRITE, f"('{b_value}', {row})", 12 * MS, MS)])  # fmt: skip
        self._change(row, "pending", "cancelled", at_ns + 11 * MS + MS // 2, "shop.jobs.expire_cart")
        self._change(row, "cancelled", b_value, at_ns + 15 * MS, "shop.handlers.capture_payment")
        self.collisions.add((f"orders:{row}", "shop.jobs.expire_cart", "shop.handlers.capture_payment"))

    def double_charge(self, order: int, at_ns: int) -> None:
        """Two charge requests for one order both find no charge, then both insert one (ids the database assigns):
        a phantom through inserts, seen only in the row images Debezium sends."""
        self.charge_id += 2
        for n, (function, offset) in enumerate((("shop.handlers.charge", 0), ("shop.handlers.charge_retry", MS))):
            self._request(function, "/orders/{id}/charges", at_ns + offset,
                          [(CHARGE_READ, f"({order},)", 0, MS), (CHARGE, f"({order}, 12.5)", 8 * MS, MS)])  # fmt: skip
            self._debezium("charges", None, {"id": self.charge_id + n, "order_id": order, "amount": 12.5},
                           at_ns + offset + 9 * MS + MS // 2, function)  # fmt: skip
        self.collisions.add((f"charges:{self.charge_id}", "shop.handlers.charge", "shop.handlers.charge_retry"))

    def oversell(self, sku: str, at_ns: int) -> None:
        """A fresh sku seeded with one unit (its row change is the first Debezium sends of ``inventory``, the
        table's key ``sku``), then two checkouts that both read stock 1 and both take a unit: ``stock = stock - 1``
        brings no value, so its changes match both writers equally (credited to none)."""
        self._debezium("inventory", None, {"sku": sku, "stock": 1}, at_ns - 50 * MS, "", key_column="sku")
        read, take = (
            "SELECT stock FROM inventory WHERE sku = %s",
            "UPDATE inventory SET stock = stock - 1 WHERE sku = %s",
        )
        for n, function in enumerate(("shop.handlers.checkout", "shop.handlers.checkout_again")):
            self._request(
                function,
                "/checkout",
                at_ns + n * MS,
                [(read, f"('{sku}',)", 0, MS), (take, f"('{sku}',)", 10 * MS, (1 + 3 * n) * MS)],
            )
        self._debezium("inventory", {"sku": sku, "stock": 1}, {"sku": sku, "stock": 0}, at_ns + 11 * MS + MS // 2,
                       "", key_column="sku")  # fmt: skip
        self._debezium("inventory", {"sku": sku, "stock": 0}, {"sku": sku, "stock": -1}, at_ns + 15 * MS, "",
                       key_column="sku")  # fmt: skip
        for lsn in (self.lsn - 16, self.lsn - 8, self.lsn):
            del self.credits[lsn]  # uncredited: no writer is named by them
        self.collisions.add((f"inventory:{sku}", "shop.handlers.checkout", "shop.handlers.checkout_again"))

    def serial_update(self, row: int, at_ns: int, value: str) -> None:
        """One request reads and writes the row, alone."""
        self._request("shop.handlers.touch", "/orders/{id}/touch", at_ns,
                      [(READ, f"({row},)", 0, MS), (WRITE, f"('{value}', {row})", 2 * MS, MS)])  # fmt: skip
        self._change(row, "x", value, at_ns + 3 * MS + MS // 2, "shop.handlers.touch")


@dataclass
class Found:
    incidents: list[dict[str, Any]] = field(default_factory=list)
    credits: dict[int, str] = field(default_factory=dict)  # lsn -> span id (of the correlated access)
    strengths: dict[int, str] = field(default_factory=dict)
    functions: dict[str, str] = field(default_factory=dict)  # span id -> code function (from stage 1's accesses)
    dead_letters: int = 0


class Chain:
    """Stage 1 and stage 2 wired in process; see the module docstring."""

    def __init__(self, env: dict[str, str], owners: Sequence[Sequence[tuple[str, int]]] = (((SPANS, 0), (CDC, 0)),)):
        """``owners``: the input partitions of each stage-1 instance (one instance owning both by default; several
        model ``--workers``, each a consumer of the group with its share of the partitions)."""
        base = {"TRACE_REPRO_KAFKA__CDC_PATTERN": r"^shop\.[^.]+\.[^.]+$"}
        self.settings = config.load(None, env={**base, **env})
        self.clock = FakeClock(T0)
        self.metrics = Metrics()
        self.workers = [self.ingest_stage(tps) for tps in owners]
        self.ingest = self.workers[0]
        t2 = PinTracker()
        self.entities = EntityStage(self.settings, self.metrics, self.clock, tracker=t2,
                                    processors=stage_processors(self.settings, self.metrics, self.clock, "entities",
                                                                t2, default().factories))  # fmt: skip
        self.offsets: dict[tuple[str, int], int] = {}
        self.found = Found()

    def ingest_stage(self, tps: Sequence[tuple[str, int]]) -> IngestStage:
        """A stage-1 instance owning ``tps``, as a worker process (or a restarted one) would be."""
        tracker = PinTracker()
        stage = IngestStage(self.settings, self.metrics, self.clock, tracker=tracker,
                            processors=stage_processors(self.settings, self.metrics, self.clock, "ingest", tracker,
                                                        default().factories))  # fmt: skip
        stage.broadcast_partitions = INTERNAL_PARTITIONS
        stage.assign(tps)
        return stage

    def _record(self, topic: str, partition: int, key: bytes | None, value: bytes | None) -> Record:
        offset = self.offsets.get((topic, partition), 0)
        self.offsets[(topic, partition)] = offset + 1
        return Record(topic, partition, offset, key, value)

    def arrivals(self, scenario: Scenario, spans_partitions: int = 1, cdc_lag_ns: int = 40 * MS) -> list[
            tuple[int, Record]]:  # fmt: skip
        """The scenario's messages as records, by the event time they arrive at (row changes ``cdc_lag_ns`` after
        their commit, Debezium's lag); the spans messages (one trace each) dealt round the spans partitions."""
        inputs = [(t, self._record(SPANS, n % spans_partitions, None, v)) for n, (t, v) in enumerate(scenario.spans)]
        inputs += [(t + cdc_lag_ns, self._record(topic, 0, k, v)) for t, k, v, topic in scenario.changes]
        return sorted(inputs, key=lambda x: x[0])

    def run(self, scenario: Scenario, rnd: random.Random, *, wall_step_s: float = 0.2, cdc_lag_s: float = 0.04,
            polls: bool = False) -> Found:  # fmt: skip
        """Feed the scenario in time order, in random batches, the clock following event time; then go idle.
        ``polls``: the consumer also polls while nothing arrives (every ``wall_step_s``), and a batch holds only
        what arrived within half a second of its first record, so quiet stretches pass in real time."""
        inputs = self.arrivals(scenario, cdc_lag_ns=int(cdc_lag_s * S))
        queue = [r for _, r in inputs]
        times = [t for t, _ in inputs]
        while queue:
            size = rnd.randint(1, 6)
            if polls:
                size = sum(1 for t in times[:size] if t <= times[0] + 500 * MS)
                while self.clock.now + int(wall_step_s * S) < times[0]:
                    self.clock.advance(wall_step_s)
                    self._step([])
            batch, queue = queue[:size], queue[size:]
            now, times = times[size - 1] if len(times) >= size else times[-1], times[size:]
            self.clock.now = max(self.clock.now, now + rnd.randint(0, 300) * MS)  # arrival lags event time
            self._step(batch)
        for _ in range(200):  # idle: event time catches up with the clock
            self.clock.advance(wall_step_s)
            self._step([])
        return self.found

    def _step(self, records: list[Record], workers: Sequence[IngestStage] | None = None) -> None:
        """One batch of every stage-1 instance in ``workers`` (default: all), each on the records of the partitions
        it owns, then stage 2 on what they sent."""
        produced = []
        for stage in self.workers if workers is None else workers:
            out = stage.process([r for r in records if (r.topic, r.partition) in stage.assignment])
            stage.release(out.release)
            produced += out.produce
        self.found.dead_letters += sum(1 for m in produced if m.topic == self.settings.kafka.dlq_topic)
        internal: list[Record] = []
        for m in produced:
            if m.topic != self.settings.kafka.accesses_topic:
                continue
            for event in internal_codec.decode_all(m.value or b""):
                if isinstance(event, Access):
                    self.found.functions[event.span_id] = event.function
            # a keyed message goes where the producer's partitioner sends it: where its row's packed accesses are
            partitions = [
                m.partition
                if m.partition is not None
                else internal_codec.partition_of(m.key or b"", INTERNAL_PARTITIONS)
            ]
            internal += [self._record(m.topic, p, m.key, m.value) for p in partitions]
        self._entities(internal)

    def _entities(self, records: list[Record]) -> None:
        out: StageOutput = self.entities.process(records)
        self.entities.release(out.release)
        for row in out.graph.changes:
            if row["span"]:
                self.found.credits[row["lsn"]] = row["span"]
            self.found.strengths[row["lsn"]] = row["strength"]
        for event in out.events:
            self.found.incidents.append(json.loads(event.model_dump_json()))

    def committable_everywhere(self) -> bool:
        """Every input position of both stages is committable: no pin left behind."""
        owned: list[tuple[Stage, set[tuple[str, int]]]] = [(w, w.assignment) for w in self.workers]
        owned.append((self.entities, {tp for tp in self.offsets if tp[0] == self.settings.kafka.accesses_topic}))
        return all(stage.committable(tp, self.offsets[tp]) == self.offsets[tp]
                   for stage, tps in owned for tp in tps if tp in self.offsets)  # fmt: skip
