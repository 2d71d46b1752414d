"""What a stock OpenTelemetry Collector writes to Kafka, and the daemon's decoder and stage 1 on exactly that.

The Collector is the pinned build of ``bench/collector`` on the shipped ``config/otel-collector.yaml`` (batch
processor, kafka exporter, ``otlp_proto``, ``partition_traces_by_id``); spans reach it through the stock OTLP/HTTP
exporter of the OpenTelemetry SDK. The records read back from Kafka are decoded by ``streamer.decode`` and fed, as
they are, to stage 1 (``IngestStage``) on a fake clock.

The kafka exporter (``partition_traces_by_id``) writes one message per resource, instrumentation scope and trace id
of each batch, keyed by the trace id: never two traces in one message, and a trace in several messages whenever its
spans come from several scopes or several export requests (the batch processor appends requests, it does not merge
their resources), all in the partition of its key.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

from bench.collector.process import StartCollector
from processors.model.events import Access
from streamer.decode import internal
from streamer.decode.otlp import decode_traces_proto
from streamer.runtime.topics import create_topics
from tests.otlp_factory import ShopTelemetry, to_proto
from tests.runtime.chain import MS, SPANS, T0, Chain, S

pytestmark = pytest.mark.engines

UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


def request(shop: ShopTelemetry, route: str, row: int, at_ns: int) -> None:
    """One request: a server span and one DB span that updates ``orders`` row ``row``."""
    with shop.tracer.start_as_current_span(
        f"POST {route}", kind=SpanKind.SERVER, start_time=at_ns, end_on_exit=False
    ) as server:
        server.set_attribute("http.route", route)
        db = shop.tracer.start_span("db", kind=SpanKind.CLIENT, start_time=at_ns + MS)
        db.set_attribute("db.system.name", "postgresql")
        db.set_attribute("db.query.text", UPDATE)
        db.set_attribute("db.statement.parameters", f"('paid', {row})")
        db.end(end_time=at_ns + 2 * MS)
        server.end(end_time=at_ns + 3 * MS)


def export(url: str, spans: Sequence[ReadableSpan]) -> None:
    """One OTLP/HTTP export request of ``spans`` to the Collector, as the SDK's BatchSpanProcessor sends them."""
    exporter = OTLPSpanExporter(endpoint=url)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


async def read(bootstrap: str, topic: str, count: int, timeout_s: float = 60) -> list[ConsumerRecord]:
    """The first ``count`` records of ``topic`` (all partitions, from the start), waiting up to ``timeout_s``."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False, group_id=None
    )
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records += batch
    finally:
        await consumer.stop()
    assert len(records) >= count, f"{len(records)} of {count} records on {topic} after {timeout_s} s"
    return sorted(records, key=lambda r: (r.partition, r.offset))


def trace_ids(record: ConsumerRecord) -> set[str]:
    data = TracesData.FromString(record.value)
    return {s.trace_id.hex() for rs in data.resource_spans for ss in rs.scope_spans for s in ss.spans}


async def test_one_trace_per_message_keyed_by_trace_id_in_one_partition(
    otel_collector: StartCollector, kafka_bootstrap: str
) -> None:
    """Eight requests exported in one OTLP request: the Collector writes one message per trace, keyed by its id,
    each holding all of its spans, which the daemon's decoder reads back whole."""
    topic = f"collector-shape-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, {topic: 3})
    collector = otel_collector(topic)
    shop = ShopTelemetry()
    for row in range(8):
        request(shop, f"/r{row}", row, T0 + row * MS)
    spans = shop.take()
    await asyncio.to_thread(export, collector.traces_url, spans)
    records = await read(kafka_bootstrap, topic, 8)
    assert len(records) == 8, [trace_ids(r) for r in records]
    expected = {s.context.trace_id.to_bytes(16, "big").hex() for s in spans}
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in records:
        [tid] = trace_ids(record)
        assert record.key == tid.encode()
        partitions[tid].add(record.partition)
        decoded = decode_traces_proto(record.value)
        assert {s.trace_id for s in decoded} == {tid} and len(decoded) == 2
    assert set(partitions) == expected
    assert len({p for ps in partitions.values() for p in ps}) > 1  # keyed: spread over the partitions


async def test_a_trace_split_over_two_messages_is_reassembled_by_stage_1(
    otel_collector: StartCollector, kafka_bootstrap: str
) -> None:
    """A request's DB span is exported first (with another whole request), its server span in a later export, as a
    BatchSpanProcessor does when the request ends after a flush. The Collector writes the trace in two messages with
    the same key; stage 1, fed those records, closes it once, whole: one Trace row rooted at the server span, its
    access on ``orders:1``, no span counted late."""
    topic = f"collector-split-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, {topic: 1})
    collector = otel_collector(topic)
    shop = ShopTelemetry()
    request(shop, "/r1", 1, T0)
    request(shop, "/r2", 2, T0 + MS)
    spans = shop.take()
    split = next(s for s in spans if s.kind is SpanKind.SERVER and (s.attributes or {}).get("http.route") == "/r1")
    split_id = split.context.trace_id.to_bytes(16, "big").hex()
    await asyncio.to_thread(export, collector.traces_url, [s for s in spans if s is not split])
    first = await read(kafka_bootstrap, topic, 2)  # both traces are on Kafka before the server span is sent
    await asyncio.to_thread(export, collector.traces_url, [split])
    records = await read(kafka_bootstrap, topic, 3)
    assert len(records) == 3 and records[:2] == first
    keyed = [r.key for r in records]
    assert keyed.count(split_id.encode()) == 2
    assert [trace_ids(r) for r in records if r.key == split_id.encode()] == [{split_id}, {split_id}]

    chain = Chain({})
    chain.ingest.extractor.keys.load([("orders", ["id"])])
    outputs = [chain.ingest.process([chain._record(SPANS, 0, r.key, r.value)]) for r in records]
    tick = ShopTelemetry()
    chain.clock.now = T0 + 60 * S
    request(tick, "/tick", 3, T0 + 60 * S)
    outputs.append(chain.ingest.process([chain._record(SPANS, 0, None, to_proto(tick.take()))]))
    traces = [row for out in outputs for row in out.graph.traces if row["id"] == split_id]
    assert [t["root"] for t in traces] == ["/r1"]
    assert not [row for out in outputs for row in out.graph.late_traces]
    assert chain.metrics.telemetry("traces").events.get("late_spans", 0) == 0
    topic_out = chain.settings.kafka.accesses_topic
    events = [
        e for out in outputs for m in out.produce if m.topic == topic_out for e in internal.decode_all(m.value or b"")
    ]
    assert {"orders:1", "orders:2"} <= {e.entity for e in events if isinstance(e, Access)}


async def test_a_trace_from_two_instrumentation_scopes_is_two_messages_even_in_one_export(
    otel_collector: StartCollector, kafka_bootstrap: str
) -> None:
    """A server span from one tracer (a web framework's instrumentation) and DB spans from another (the database
    driver's), exported together: the kafka exporter splits per resource, scope and trace id, so the trace is two
    messages with the same key, one scope each. This is the shape of every request of an auto-instrumented service."""
    topic = f"collector-scopes-{uuid.uuid4().hex[:8]}"
    await create_topics(kafka_bootstrap, {topic: 1})
    collector = otel_collector(topic)
    shop = ShopTelemetry()
    web, driver = shop.provider.get_tracer("web-framework"), shop.provider.get_tracer("db-driver")
    with web.start_as_current_span("POST /r1", kind=SpanKind.SERVER) as server:
        for _ in range(2):
            driver.start_span("db", kind=SpanKind.CLIENT).end()
    trace_id = server.get_span_context().trace_id.to_bytes(16, "big").hex()
    await asyncio.to_thread(export, collector.traces_url, shop.take())
    records = await read(kafka_bootstrap, topic, 2)
    assert [r.key for r in records] == [trace_id.encode()] * 2
    scopes = [
        {
            (ss.scope.name, len(ss.spans))
            for rs in TracesData.FromString(r.value).resource_spans
            for ss in rs.scope_spans
        }
        for r in records
    ]
    assert sorted(scopes, key=str) == [{("db-driver", 2)}, {("web-framework", 1)}]
