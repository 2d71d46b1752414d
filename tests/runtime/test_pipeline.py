"""Kafka → decode → traces and windows → FalkorDB, end to end on the real engines."""

from __future__ import annotations

import time

import pytest

from processors.graph.rows import GraphPolicyConfig
from tests.harness import Harness
from tests.otlp_factory import ShopTelemetry, ids, to_json, to_proto

pytestmark = pytest.mark.engines

UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


def _workload(base_ns: int) -> ShopTelemetry:
    shop = ShopTelemetry()
    shop.request("/orders/{id}/capture", statements=[(UPDATE, "('paid', 8812)")], function="capture_payment",
                 start_ns=base_ns)  # fmt: skip
    shop.request("/cart", error=True, function="view_cart", start_ns=base_ns + 2_000_000)
    shop.request("/health", function="health", start_ns=base_ns + 4_000_000)
    return shop


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
async def test_sdk_batches_land_in_graph_exactly(harness: Harness, encoding: str) -> None:
    """Spans from the SDK's own encoder become exactly the expected nodes, edges and properties."""
    harness.settings = harness.settings.model_copy(
        update={
            "kafka": harness.settings.kafka.model_copy(update={"span_encoding": encoding}),
            "graph_policy": GraphPolicyConfig(detail="entities_or_errors"),  # every span of the detailed traces
        }
    )
    shop = _workload(time.time_ns())
    spans = shop.take()
    encode = to_proto if encoding == "otlp_proto" else to_json
    await harness.start()
    await harness.produce(harness.settings.kafka.spans_topic, [encode(spans[:5]), encode(spans[5:])])
    await harness.wait_for(lambda: harness.count("MATCH ()-[c:CALLS]->() RETURN count(c)") > 0, "window closed")

    detailed = [s for s in spans if s.resource and s.context]
    trace_ids, _ = ids(detailed)
    # policy entities_or_errors: the capture trace (touches orders:8812) and the failing /cart trace
    capture = [s for s in spans if s.name in ("POST /orders/{id}/capture", "capture_payment", "db")]
    cart = [s for s in spans if s.name in ("POST /cart", "view_cart")]
    want_traces, want_spans = ids(capture + cart)
    assert len(trace_ids) == 3
    got_traces = {r[0] for r in harness.graph_rows("MATCH (t:Trace) RETURN t.id")}
    assert got_traces == want_traces
    got_spans = {r[0] for r in harness.graph_rows("MATCH (s:Span) RETURN s.id")}
    assert got_spans == want_spans
    assert harness.count("MATCH (:Span)-[c:CHILD_OF]->(:Span) RETURN count(c)") == len(want_spans) - 2
    assert harness.count("MATCH (:Span)-[o:OF]->(:Trace) RETURN count(o)") == len(want_spans)
    rows = harness.graph_rows(
        "MATCH (s:Span)-[w:WROTE]->(e:Entity) RETURN s.name, s.function, e.key, e.table, w.lock, w.op, w.params"
    )
    # No row change of orders was seen, so its key is not known: the UPDATE is kept as a predicate access on the
    # table's scope (never dropped), with its predicate on the edge; no row is known to have been written.
    assert rows == []
    rows = harness.graph_rows("MATCH (s:Span)-[p:PREDICATE]->(e:Entity) RETURN s.name, e.key, p.op, p.predicate")
    assert rows == [["db", "orders:*", "write", "id = 8812"]]
    rows = harness.graph_rows("MATCH (t:Trace) RETURN t.root, t.status, t.version ORDER BY t.root")
    assert rows == [["/cart", "error", "1.0.0"], ["/orders/{id}/capture", "ok", "1.0.0"]]
    err = harness.graph_rows("MATCH (s:Span {name: 'POST /cart'}) RETURN s.status, s.http_status, s.exception")
    assert err == [["error", 500, "RuntimeError"]]
    ops = {r[0] for r in harness.graph_rows("MATCH (:Service {name: 'checkout'})-[:EXPOSES]->(o) RETURN o.key")}
    assert ops == {"checkout:/orders/{id}/capture", "checkout:/cart", "checkout:/health"}
    calls = harness.graph_rows("MATCH (a)-[c:CALLS]->(b) RETURN a.name, b.name, c.count, c.errors")
    assert calls == [["checkout", "postgresql", 1, 0]]
