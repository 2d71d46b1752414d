"""What the fault-injection tests share: planted traffic, a private set of engines, and the exactly-once checks.

Traffic is built the way the daemon receives it in production. Every request is one trace recorded with the
OpenTelemetry SDK and encoded by the SDK's own OTLP encoder (``tests.otlp_factory``); its spans go to Kafka as the
collector's ``kafka`` exporter with ``partition_traces_by_id`` writes them: ``TracesData`` messages keyed by the
trace id, the children (which end first) in one message and the server span in a later one (``root_lag``
requests later: the collector's next export batch). Every committed row change is a Debezium JSON envelope
(``schemas.enable=false``) keyed by the row's primary key, on ``<prefix>.public.orders``; the row carries the
writer's trace id in its ``trace_id`` column, the strongest correlation evidence.

Two kinds of requests:

- background ``POST /orders/{id}/capture`` requests, each updating its own order row (one writer per row: never a
  collision), and ``GET /products`` requests without a statement;
- *planted lost updates*: on a fresh order, the ``expire_cart`` job and a ``capture_payment`` request both read the
  row without a lock and then write it without a guard, interleaved (r1 r2 w1 w2), and Debezium reports both
  updates ('pending' -> 'cancelled' by the job, then 'cancelled' -> 'paid' by the request: the cancellation is
  lost). Each must become exactly one ``lost_update`` incident occurrence on that row.

:class:`Expected` remembers what was produced; :func:`assert_graph_exactly_once`, :func:`assert_incidents_once`,
:func:`assert_graph_occurrences_once` and :func:`assert_one_issue_per_fingerprint` compare the graph, the incidents
topic and the GitLab issues with it. :func:`wait_committed_past` waits on the broker's committed offsets (not on the
daemon's internals) until everything produced has left the daemon's open state.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.gitlab_server import FakeGitLab
from sinks.gitlab.markdown import fingerprint_label
from sinks.gitlab.state import IssueState
from streamer.engines import Layout, LocalEngines
from tests.harness import Harness, harness_settings
from tests.otlp_factory import ShopTelemetry, ids, to_proto

READ = "SELECT status, amount FROM orders WHERE id = %s"
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"
MS = 1_000_000
GITLAB_TOKEN = "fault-token"
GITLAB_PROJECT = "trace-repro/faults"

# Settings every fault test runs with (on top of tests.harness.harness_settings): every trace kept in detail, so
# that every produced trace and span must be in the graph; the collision detector as in the live collision tests.
SETTINGS = {
    "graph_policy__detail": "all",
    "collisions__window_s": "2",
    "collisions__settle_s": "1",
    "kafka__poll_timeout_ms": "100",
}

# A trace's server span goes out this many requests after its children (the collector's next export batch), so that
# an interruption between the two messages finds traces half-read.
ROOT_LAG = 6

Message = tuple[str, bytes, bytes]  # (topic, key, value)


@dataclass
class Expected:
    """Everything produced so far: per trace its root route and status, every span id, the planted rows."""

    traces: dict[str, tuple[str, str]] = field(default_factory=dict)
    spans: set[str] = field(default_factory=set)
    parents: dict[str, tuple[str, str]] = field(default_factory=dict)  # span id -> (parent span id, trace id)
    writes: int = 0  # DB write spans (each must become one WROTE edge)
    planted: list[str] = field(default_factory=list)  # entity keys with a planted lost update


class Traffic:
    """Builds the messages of background requests and planted lost updates; see the module docstring."""

    def __init__(self, spans_topic: str, cdc_topic: str, *, first_order: int = 10_000, root_lag: int = 0) -> None:
        self.spans_topic = spans_topic
        self.root_lag = root_lag  # a trace's server span goes out this many requests after its children
        self._roots: deque[Message] = deque()
        self.cdc_topic = cdc_topic
        self.shop = ShopTelemetry(service="shop")
        self.expected = Expected()
        self._order = first_order
        self._lsn = 1_000
        self._requests = 0

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _trace(
        self, route: str, function: str, statements: Sequence[tuple[str, str]], start_ns: int
    ) -> tuple[str, list[Message]]:
        """One request as span messages keyed by trace id: children first, then the server span."""
        self.shop.request(route, statements=statements, function=function, start_ns=start_ns)
        spans = self.shop.take()
        (trace_id,), span_ids = ids(spans)
        self.expected.traces[trace_id] = (route, "ok")
        self.expected.spans |= span_ids
        for span in spans:
            if span.parent is not None and span.context is not None:
                child, parent = format(span.context.span_id, "016x"), format(span.parent.span_id, "016x")
                self.expected.parents[child] = (parent, trace_id)
        self.expected.writes += sum(1 for sql, _ in statements if sql.startswith("UPDATE"))
        children = [s for s in spans if s.parent is not None]
        roots = [s for s in spans if s.parent is None]
        key = trace_id.encode()
        out = [(self.spans_topic, key, to_proto(children))]
        self._roots.append((self.spans_topic, key, to_proto(roots)))
        while len(self._roots) > self.root_lag:
            out.append(self._roots.popleft())
        return trace_id, out

    def flush(self) -> list[Message]:
        """The server spans still held back by ``root_lag``."""
        out = list(self._roots)
        self._roots.clear()
        return out

    def _change(self, order: int, before: dict[str, Any], after: dict[str, Any], commit_ns: int) -> Message:
        """A Debezium update event of ``orders`` (``REPLICA IDENTITY FULL``: a complete before-image)."""
        self._lsn += 8
        commit_ms = commit_ns // MS
        value = {
            "before": {"id": order, "amount": 4200, **before},
            "after": {"id": order, "amount": 4200, **after},
            "source": {
                "version": "3.6.0.Final",
                "connector": "postgresql",
                "name": "faults",
                "ts_ms": commit_ms,
                "snapshot": "false",
                "db": "postgres",
                "sequence": None,
                "schema": "public",
                "table": "orders",
                "txId": self._lsn // 8,
                "lsn": self._lsn,
                "xmin": None,
            },
            "op": "u",
            "ts_ms": commit_ms + 3,
            "transaction": None,
        }
        return self.cdc_topic, json.dumps({"id": order}).encode(), json.dumps(value).encode()

    def background(self, n: int, *, start_ns: int | None = None, step_ms: float = 2.0) -> list[Message]:
        """``n`` independent requests ``step_ms`` apart: two thirds capture a fresh order, one third browse."""
        base = start_ns or time.time_ns()
        out: list[Message] = []
        for i in range(n):
            at = base + int(i * step_ms * MS)
            self._requests += 1
            if self._requests % 3 == 0:
                out += self._trace("/products", "list_products", (), at)[1]
                continue
            order = self._next_order()
            trace_id, messages = self._trace("/orders/{id}/capture", "capture_payment",
                                             [(UPDATE, f"('paid', {order})")], at)  # fmt: skip
            out += messages
            out.append(self._change(order, {"status": "pending", "trace_id": None},
                                    {"status": "paid", "trace_id": trace_id}, at + MS))  # fmt: skip
        return out

    def lost_update(self, *, start_ns: int | None = None) -> list[Message]:
        """A planted lost update on a fresh order: r1 r2 w1 w2 by the job and the request, and both commits."""
        order = self._next_order()
        at = start_ns or time.time_ns()
        job, job_messages = self._trace("/jobs/expire_cart", "expire_cart",
                                        [(READ, f"({order},)"), (UPDATE, f"('cancelled', {order})")], at)  # fmt: skip
        request, request_messages = self._trace("/orders/{id}/capture", "capture_payment",
                                                [(READ, f"({order},)"), (UPDATE, f"('paid', {order})")],
                                                at + 2_000)  # fmt: skip
        self.expected.planted.append(f"orders:{order}")
        return [
            *job_messages,
            *request_messages,
            self._change(
                order, {"status": "pending", "trace_id": None}, {"status": "cancelled", "trace_id": job}, at + MS
            ),
            self._change(
                order, {"status": "cancelled", "trace_id": job}, {"status": "paid", "trace_id": request}, at + 2 * MS
            ),
        ]

    def stream(self, requests: int, collisions: int, *, start_ns: int | None = None, step_ms: float = 2.0,
               flush: bool = True) -> list[Message]:  # fmt: skip
        """``requests`` background requests ``step_ms`` apart in event time, with ``collisions`` planted lost updates
        spread evenly among them (and, with ``flush``, every server span still held back)."""
        base = start_ns or time.time_ns()
        every = max(1, requests // max(collisions, 1))
        step = int(step_ms * MS)
        out: list[Message] = []
        planted = 0
        for i in range(requests):
            out += self.background(1, start_ns=base + i * step)
            if planted < collisions and i % every == every // 2:
                out += self.lost_update(start_ns=base + i * step + step // 2)
                planted += 1
        while planted < collisions:
            out += self.lost_update(start_ns=base + requests * step + planted * MS)
            planted += 1
        return out + self.flush() if flush else out


async def produce(bootstrap: str, messages: Iterable[Message]) -> None:
    """Produce every message (idempotent producer, ``acks=all``) and wait for all acknowledgements."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                                max_request_size=16 * 1024 * 1024)  # fmt: skip
    await producer.start()
    try:
        futures = [await producer.send(topic, value, key=key) for topic, key, value in messages]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def live(bootstrap: str, traffic: Traffic, *, seconds: float, per_s: int, collision_every_s: float,
               tick_s: float = 0.05) -> None:  # fmt: skip
    """Traffic as it happens: every ``tick_s``, the requests of that tick with event time now, a planted lost update
    every ``collision_every_s``; for ``seconds``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await producer.start()
    try:
        per_tick = max(1, round(per_s * tick_s))
        ticks = round(seconds / tick_s)
        every = max(1, round(collision_every_s / tick_s))
        begin = time.monotonic()
        for i in range(ticks):
            last = i == ticks - 1
            messages = traffic.stream(per_tick, 1 if i % every == every // 2 else 0, step_ms=tick_s * 1000 / per_tick,
                                      flush=last)  # fmt: skip
            acks = [await producer.send(topic, value, key=key) for topic, key, value in messages]
            await asyncio.gather(*acks)
            await asyncio.sleep(max(0.0, begin + (i + 1) * tick_s - time.monotonic()))
    finally:
        await producer.stop()


def cdc_topic(harness: Harness) -> str:
    """The Debezium topic of ``orders`` that the harness's ``kafka.cdc_pattern`` matches."""
    tag = harness.settings.kafka.group_id.rsplit("-", 1)[1]
    return f"cdc{tag}.public.orders"


def fault_harness(bootstrap: str, falkordb_url: str, gitlab: FakeGitLab | None = None, **overrides: str) -> Harness:
    """A harness with :data:`SETTINGS`, and the GitLab sink filing to ``gitlab`` when given."""
    extra = dict(SETTINGS)
    if gitlab is not None:
        extra |= {"gitlab__url": gitlab.url, "gitlab__project": GITLAB_PROJECT, "gitlab_token": GITLAB_TOKEN,
                  "gitlab__backoff_s": "0.2", "gitlab__max_backoff_s": "2"}  # fmt: skip
    extra |= overrides
    return Harness(harness_settings(bootstrap, falkordb_url, **extra), bootstrap, falkordb_url)


@contextmanager
def private_engines(*names: str) -> Iterator[LocalEngines]:
    """The named engines in a run directory of their own, stopped (and removed) on exit."""
    default = Layout.default()
    run_dir = Path(tempfile.mkdtemp(prefix="trace-repro-faults-"))
    local = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir, run_dir=run_dir))
    try:
        local.up(list(names))
        yield local
    finally:
        local.down()


def graph_counts(harness: Harness) -> tuple[int, int]:
    """(Trace nodes, Span nodes) in the harness's graph."""
    rows = harness.graph_rows("MATCH (t:Trace) WITH count(t) AS t MATCH (s:Span) RETURN t, count(s)")
    return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)


def occurrences(harness: Harness) -> int:
    """Incident occurrences recorded on the graph."""
    return harness.count("MATCH (o:Occurrence) RETURN count(o)")


def drops(harness: Harness) -> dict[str, float]:
    """The daemon's non-zero drop and lateness counters (``trace_repro_dropped_total``, ``..._late_events_total``)."""
    if harness.daemon is None:
        return {}
    out = {}
    for family in harness.daemon.metrics.registry.collect():
        for sample in family.samples:
            if sample.name in ("trace_repro_dropped_total", "trace_repro_late_events_total") and sample.value:
                out[f"{sample.name}{sorted(sample.labels.values())}"] = sample.value
    return out


async def wait_all(harness: Harness, expected: Expected, what: str, timeout_s: float = 60) -> None:
    """Wait until the graph holds as many traces as were produced and an occurrence per planted collision."""
    deadline = time.monotonic() + timeout_s
    while True:
        traces, found = graph_counts(harness)[0], occurrences(harness)
        if traces >= len(expected.traces) and found >= len(expected.planted):
            return
        if harness.task is not None and harness.task.done():
            harness.task.result()
        if time.monotonic() > deadline:
            rows = harness.graph_rows("MATCH (o:Occurrence) RETURN o.entity")
            missed = sorted(set(expected.planted) - {r[0] for r in rows})
            raise AssertionError(f"timed out waiting for {what}: {traces} of {len(expected.traces)} traces in the "
                                 f"graph; {found} occurrences for {len(expected.planted)} planted collisions, "
                                 f"none on {missed}; the daemon's drops and late events: {drops(harness)}")  # fmt: skip
        await asyncio.sleep(0.2)


def assert_graph_exactly_once(harness: Harness, expected: Expected) -> None:
    """Every produced trace and span is in the graph exactly once, with its edges once and the right root."""
    traces = harness.graph_rows("MATCH (t:Trace) RETURN t.id, t.root, t.status")
    duplicated = [t for t, n in Counter(r[0] for r in traces).items() if n > 1]
    assert not duplicated, f"Trace nodes twice: {duplicated[:5]}"
    got = {r[0]: (r[1], r[2]) for r in traces}
    missing = expected.traces.keys() - got.keys()
    assert not missing, (
        f"{len(missing)} of {len(expected.traces)} traces missing from the graph, e.g. {sorted(missing)[:3]}"
    )
    assert got.keys() == expected.traces.keys(), f"unexpected traces: {sorted(got.keys() - expected.traces.keys())[:5]}"
    wrong = {t: (got[t], want) for t, want in expected.traces.items() if got[t] != want}
    assert not wrong, f"{len(wrong)} traces with a wrong root/status (got, want): {list(wrong.items())[:3]}"

    spans = [r[0] for r in harness.graph_rows("MATCH (s:Span) RETURN s.id")]
    duplicated = [s for s, n in Counter(spans).items() if n > 1]
    assert not duplicated, f"Span nodes twice: {duplicated[:5]}"
    assert set(spans) == expected.spans, (
        f"{len(expected.spans - set(spans))} spans missing, {len(set(spans) - expected.spans)} unexpected"
    )
    assert harness.count("MATCH (:Span)-[o:OF]->(:Trace) RETURN count(o)") == len(expected.spans)
    edges = Counter((r[0], r[1]) for r in harness.graph_rows("MATCH (c:Span)-[:CHILD_OF]->(p:Span) RETURN c.id, p.id"))
    want = {(child, parent) for child, (parent, _) in expected.parents.items()}
    assert not [e for e, n in edges.items() if n > 1], "CHILD_OF edges twice"
    missing = sorted(want - edges.keys())
    assert not missing, (
        f"{len(missing)} CHILD_OF edges missing (child, parent, trace): "
        f"{[(c, p, expected.parents[c][1]) for c, p in missing[:3]]}"
    )
    assert edges.keys() == want
    assert harness.count("MATCH (:Span)-[w:WROTE]->(:Entity) RETURN count(w)") == expected.writes


def incident_events(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The incident events among Kafka records of the incidents topic."""
    return [json.loads(m.value) for m in messages if json.loads(m.value).get("kind") == "incident"]


def assert_incidents_once(events: Sequence[dict[str, Any]], expected: Expected) -> None:
    """One ``lost_update`` occurrence per planted row on the incidents topic, nothing twice, nothing else."""
    entities = Counter(e["entity"] for e in events)
    twice = {k: n for k, n in entities.items() if n > 1}
    assert not twice, f"incidents published more than once per row: {twice}"
    missed = set(expected.planted) - entities.keys()
    assert not missed, f"{len(missed)} of {len(expected.planted)} planted lost updates not reported: {sorted(missed)}"
    assert entities.keys() == set(expected.planted), (
        f"unexpected incidents: {sorted(entities.keys() - set(expected.planted))}"
    )
    assert len({e["occurrence"] for e in events}) == len(events)
    for e in events:
        assert e["anomaly"] == "lost_update", e["anomaly"]
        assert {e["culprit"]["function"], e["victim"]["function"]} == {"expire_cart", "capture_payment"}


def assert_incidents_carry_row_changes(events: Sequence[dict[str, Any]]) -> None:
    """Each planted lost update is reported with both of its row changes and the value it lost (manifest)."""
    latent = sorted(e["entity"] for e in events if not e["manifest"] or len(e["commits"]) != 2)
    assert not latent, (
        f"{len(latent)} of {len(events)} planted lost updates reported without their row changes (latent, no damage), "
        f"though Debezium delivered both: {latent}"
    )
    for e in events:
        assert "status = 'cancelled' overwritten by 'paid'" in e["damage"], e["damage"]


def assert_graph_occurrences_once(harness: Harness, events: Sequence[dict[str, Any]]) -> None:
    """The graph holds one Occurrence per published incident, on its Incident, and each Incident counts them."""
    rows = harness.graph_rows("MATCH (o:Occurrence)-[:OF]->(i:Incident) RETURN o.id, o.entity, i.fingerprint")
    assert sorted(r[0] for r in rows) == sorted(e["occurrence"] for e in events)
    assert sorted(r[1] for r in rows) == sorted(e["entity"] for e in events)
    for fingerprint, n in Counter(e["fingerprint"] for e in events).items():
        got = harness.graph_rows("MATCH (i:Incident {fingerprint: $fp}) RETURN i.occurrences", {"fp": fingerprint})
        assert got == [[n]], (fingerprint, got, n)


def assert_one_issue_per_fingerprint(gitlab: FakeGitLab, events: Sequence[dict[str, Any]]) -> None:
    """Exactly one GitLab issue per fingerprint, counting each of its occurrences once."""
    by_fp: dict[str, set[str]] = {}
    for e in events:
        by_fp.setdefault(e["fingerprint"], set()).add(e["occurrence"])
    issues = gitlab.issues()
    assert len(issues) == len(by_fp), [(i["iid"], i["title"], i["labels"]) for i in issues]
    for fingerprint, occurrence_ids in by_fp.items():
        mine = gitlab.issues(tag=fingerprint_label(fingerprint))
        assert len(mine) == 1, [(i["iid"], i["state"]) for i in mine]
        state = IssueState.parse(mine[0]["description"])
        assert state is not None
        assert state.occurrences == len(occurrence_ids), (state.occurrences, len(occurrence_ids))
        assert set(state.recent) == occurrence_ids


def _issue_counts(gitlab: FakeGitLab, events: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Per fingerprint: (occurrences its issue counts, occurrences published); -1 when it has no issue."""
    out = {}
    for fingerprint, n in Counter(e["fingerprint"] for e in events).items():
        mine = gitlab.issues(tag=fingerprint_label(fingerprint))
        state = IssueState.parse(mine[0]["description"]) if mine else None
        out[fingerprint] = (state.occurrences if state is not None else -1, n)
    return out


async def wait_issues(harness: Harness, gitlab: FakeGitLab, events: Sequence[dict[str, Any]],
                      timeout_s: float = 60) -> None:  # fmt: skip
    """Wait until every fingerprint has its issue counting every published occurrence (the GitLab sink caught up)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = _issue_counts(gitlab, events)
        if all(seen >= n for seen, n in counts.values()):
            return
        if harness.task is not None and harness.task.done():
            harness.task.result()
        if time.monotonic() > deadline:
            sinks = {}
            if harness.daemon is not None:
                for t in harness.daemon.metrics.telemetry.all():
                    if t.component.startswith("sink.") or t.component == "gitlab":
                        sinks[t.component] = {**dict(t.events), **{f"dropped:{k}": v for k, v in t.dropped.items()}}
            raise AssertionError(f"timed out waiting for the GitLab issues: (counted, published) per fingerprint "
                                 f"{counts}; sink telemetry {sinks}")  # fmt: skip
        await asyncio.sleep(0.2)


def tag() -> str:
    """A short unique suffix for names."""
    return uuid.uuid4().hex[:8]


async def _committed(bootstrap: str, groups: Iterable[str]) -> dict[tuple[str, str, int], int]:
    """The offsets each consumer group has committed on the broker, by (group, topic, partition)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        out = {}
        for group in groups:
            for tp, meta in (await admin.list_consumer_group_offsets(group)).items():
                out[(group, tp.topic, tp.partition)] = meta.offset
        return out
    finally:
        await admin.close()


async def _ends(bootstrap: str, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    """The end offset of every partition of ``topics``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(list(topics))
    finally:
        await admin.close()
    tps = [TopicPartition(t["topic"], p["partition"]) for t in described for p in t["partitions"]]
    # (a group id, though it never joins: aiokafka's group-less consumer can fail to stop right after starting)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=f"ends-{tag()}")
    await consumer.start()
    try:
        return {(tp.topic, tp.partition): end for tp, end in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def wait_committed_past(harness: Harness, what: str, timeout_s: float = 60) -> None:
    """Wait until both stages' consumer groups have committed, on the broker, every input partition up to where it
    ended when this was called: everything produced so far has left the daemon's open state.

    (Stage 1's watermark heartbeats keep the internal topic growing, so "committed up to the current end" may
    never hold; "committed past the end as of now" does.)
    """
    k = harness.settings.kafka
    inputs = {k.group_id: [k.spans_topic, cdc_topic(harness)], f"{k.group_id}.entities": [k.accesses_topic]}
    target = {}
    for group, topics in inputs.items():
        for (topic, partition), end in (await _ends(harness.bootstrap, topics)).items():
            if end:
                target[(group, topic, partition)] = end
    assert target, f"no input partition of {inputs} has data"
    deadline = time.monotonic() + timeout_s
    while True:
        committed = await _committed(harness.bootstrap, inputs)
        behind = {key: (committed.get(key), end) for key, end in target.items() if committed.get(key, -1) < end}
        if not behind:
            return
        if harness.task is not None and harness.task.done():
            harness.task.result()
        assert time.monotonic() < deadline, f"timed out waiting for {what}: (committed, end) {behind}"
        await asyncio.sleep(0.3)
