"""The benchmark's OTLP generator: deterministic, realistic proportions, and decodable by the daemon's decoder."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench.otlp_gen import generate, generate_run
from processors.model.events import SpanKind, StatusCode
from streamer.decode import decode_traces_proto

START_NS = 1_750_000_000_000_000_000


@pytest.fixture(scope="module")
def run() -> object:
    return generate_run(30_000, 250, seed=7, start_ns=START_NS)


def test_deterministic_for_a_seed() -> None:
    a = generate(3_000, 300, seed=3, start_ns=START_NS)
    assert a == generate(3_000, 300, seed=3, start_ns=START_NS)
    assert a != generate(3_000, 300, seed=4, start_ns=START_NS)


def test_decodes_into_the_expected_spans(run) -> None:
    spans = [s for m in run.messages for s in decode_traces_proto(m)]
    assert len(spans) == run.spans == sum(run.span_counts)
    assert 30_000 <= run.spans < 30_000 + 100  # whole traces only
    assert run.span_counts[:-1] == [250] * (len(run.span_counts) - 1)
    assert [len(decode_traces_proto(m)) for m in run.messages[:5]] == run.span_counts[:5]
    assert len({s.span_id for s in spans}) == len(spans)
    assert len({s.trace_id for s in spans}) == run.traces
    assert 8 <= run.spans / run.traces <= 12
    assert {s.resource.service for s in spans} == {"frontend", "checkout", "inventory", "payments", "shipping"}
    assert all(s.resource.version and s.resource.environment == "bench" for s in spans)
    assert all(START_NS <= s.start_ns <= s.end_ns <= run.end_ns for s in spans)
    ends = [[s.end_ns for s in decode_traces_proto(m)] for m in run.messages]
    assert all(max(a) <= min(b) for a, b in itertools.pairwise(ends))  # batched in the order spans end
    servers = [s for s in spans if s.kind == SpanKind.SERVER]
    assert servers and all(s.route and s.http_status in (200, 500) for s in servers)
    assert sum(1 for s in spans if not s.parent_id) == run.traces
    assert Counter(s.kind for s in spans)[SpanKind.INTERNAL] == len(servers)
    assert all(s.code_function and s.code_file for s in spans if s.kind == SpanKind.INTERNAL)


def test_about_ten_percent_db_spans(run) -> None:
    spans = [s for m in run.messages for s in decode_traces_proto(m)]
    db = [s for s in spans if s.db is not None]
    assert len(db) == run.db_spans
    assert 0.08 <= len(db) / len(spans) <= 0.12
    assert {s.db.system for s in db} == {"postgresql"}
    assert "UPDATE orders SET status = %s WHERE id = %s" in {s.db.statement for s in db}
    assert all(s.db.params and s.kind == SpanKind.CLIENT for s in db)


def test_about_one_percent_error_traces(run) -> None:
    spans = [s for m in run.messages for s in decode_traces_proto(m)]
    failed = {s.trace_id for s in spans if s.status == StatusCode.ERROR}
    assert len(failed) == run.error_traces
    assert 0.005 <= len(failed) / run.traces <= 0.02
    with_exception = {s.trace_id for s in spans if s.exception_type}
    assert with_exception == failed
    roots = [s for s in spans if not s.parent_id and s.trace_id in failed]
    assert all(r.status == StatusCode.ERROR and r.http_status == 500 for r in roots)


def test_messages_are_grouped_by_resource(run) -> None:
    msg = TracesData()
    msg.ParseFromString(run.messages[0])
    keys = [
        tuple((kv.key, kv.value.string_value) for kv in rs.resource.attributes if kv.key.startswith("service."))
        for rs in msg.resource_spans
    ]
    assert len(keys) == len(set(keys)) > 1


def test_partitions_keep_every_trace_on_one_partition() -> None:
    """With partitions, each trace's spans are on one partition, messages stay full, nothing is lost or moved."""
    one = generate_run(6_000, 200, seed=5, start_ns=START_NS)
    assert set(one.partitions) == {0} and len(one.partitions) == len(one.messages)
    two = generate_run(6_000, 200, seed=5, start_ns=START_NS, partitions=2)
    assert set(two.partitions) == {0, 1} and two.spans == one.spans and two.traces == one.traces
    assert sum(two.span_counts) == two.spans and sum(1 for n in two.span_counts if n < 200) <= 2
    where: dict[str, set[int]] = {}
    for m, p in zip(two.messages, two.partitions, strict=True):
        for s in decode_traces_proto(m):
            where.setdefault(s.trace_id, set()).add(p)
    assert len(where) == two.traces and all(len(ps) == 1 for ps in where.values())
    for q in (0, 1):  # each partition batched in the order spans end
        mine = [m for m, p in zip(two.messages, two.partitions, strict=True) if p == q]
        ends = [[s.end_ns for s in decode_traces_proto(m)] for m in mine]
        assert all(max(a) <= min(b) for a, b in itertools.pairwise(ends))


def test_the_collector_shape_has_one_trace_per_message_and_every_span() -> None:
    """As the Collector's kafka exporter writes them: each message one trace (keyed by its id, on its partition),
    the same spans as the bench shape, none lost or repeated; batches still go in the order spans end."""
    bench = generate_run(6_000, 200, seed=5, start_ns=START_NS, partitions=2)
    shaped = generate_run(6_000, 200, seed=5, start_ns=START_NS, partitions=2, shape="collector")
    assert (shaped.spans, shaped.traces, shaped.db_spans) == (bench.spans, bench.traces, bench.db_spans)
    assert len(shaped.messages) == len(shaped.keys) == len(shaped.partitions) == len(shaped.span_counts)
    assert len(shaped.messages) > bench.traces  # a trace's spans reach the collector in several batches
    assert bench.keys == []
    seen: list[tuple[str, bytes]] = []
    for m, key, p, n in zip(shaped.messages, shaped.keys, shaped.partitions, shaped.span_counts, strict=True):
        spans = decode_traces_proto(m)
        assert len(spans) == n and {s.trace_id for s in spans} == {key.decode()}
        assert p == int(key[-16:], 16) % 2  # the trace's partition, as in the bench shape
        data = TracesData.FromString(m)
        assert len(data.resource_spans) == 1 and len(data.resource_spans[0].scope_spans) == 1
        seen += [(s.trace_id, bytes.fromhex(s.span_id)) for s in spans]
    every = sorted((s.trace_id, bytes.fromhex(s.span_id)) for m in bench.messages for s in decode_traces_proto(m))
    assert sorted(seen) == every and len(set(seen)) == len(seen)
    with pytest.raises(ValueError, match="shape"):
        generate_run(100, 10, shape="jaeger")


@pytest.mark.parametrize("shape", ["bench", "collector"])
def test_stock_spans_carry_no_parameters_nor_code_location_and_are_otherwise_the_same(shape: str) -> None:
    plain = generate_run(3_000, 300, seed=5, start_ns=START_NS, shape=shape)
    stock = generate_run(3_000, 300, seed=5, start_ns=START_NS, shape=shape, stock=True)
    keys: Counter[str] = Counter()
    for m in stock.messages:
        for rs in TracesData.FromString(m).resource_spans:
            for ss in rs.scope_spans:
                keys.update(kv.key for sp in ss.spans for kv in sp.attributes)
    assert keys["db.query.text"] > 0 and keys["http.route"] > 0
    assert not [k for k in keys if k.startswith(("code.", "db.statement.parameters", "db.query.parameter"))]

    def core(messages: list[bytes]) -> list[tuple[object, ...]]:
        spans = (s for m in messages for s in decode_traces_proto(m))
        return sorted(
            (s.trace_id, s.span_id, s.parent_id, s.name, s.kind, s.start_ns, s.end_ns, s.status) for s in spans
        )

    assert (stock.spans, stock.traces, stock.db_spans) == (plain.spans, plain.traces, plain.db_spans)
    assert core(stock.messages) == core(plain.messages)
