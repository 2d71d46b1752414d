"""A finding of a type the graph sink does not know, on the real FalkorDB: an ``Incident:Finding`` node per
fingerprint with its type, title, subject, severity and data, an Occurrence each, ON its Operation (or Service),
fixed by its verdict and reopened by a later occurrence, hostile text kept as data."""

from __future__ import annotations

import json

import pytest

from processors.connectors.proofs.contracts import ProofContract
from processors.model.finding import RENDERERS, Subject, register_renderer
from processors.model.verdict import Receipt, VerdictEvent
from processors.pipeline.requests import operation_key_of
from sinks.graph.records import GRAPH_ROWS, finding_row, rows_of
from sinks.graph.sink import GraphSink
from tests.finding_samples import T0, finding
from tests.gitlab.helpers import incident

pytestmark = pytest.mark.engines

FP = "fp-sample-hang"


def verdict(outcome: str, window_end_ms: float) -> VerdictEvent:
    receipt = Receipt(before_errors=20, before_requests=320, after_errors=0, after_requests=400, test="exact",
                      p_value=0.001, interval=None, must_start_seen=0, still_happens_at=[], requests_needed=0,
                      window_start_unix_ms=window_end_ms - 60_000, window_end_unix_ms=window_end_ms)  # fmt: skip
    return VerdictEvent(fingerprint=FP, contract="sample_hang:fp-sample-hang", service="checkout", version="1.4.3",
                        commit="abc", outcome=outcome, rollback=False, reason=outcome, receipt=receipt)  # fmt: skip


async def test_a_finding_is_a_node_with_its_occurrences_on_its_operation(sink: GraphSink) -> None:
    await sink.record([ProofContract(signature="sample_hang:fp-sample-hang", fingerprint=FP, service="checkout")])
    await sink.record(await sink.unseen([finding("o2", T0 + 500), finding("o2", T0 + 500)]))
    await sink.record([finding("o1", T0, title="older", data={"calls": 1, "hung": 1, "p95_ms": 1.0,
                                                              "dependency": "payments"})])  # fmt: skip
    [row] = await sink.query(
        "MATCH (i:Finding {fingerprint: $fp}) RETURN labels(i), i.type, i.class, i.title, i.severity, i.remedy, "
        "i.service, i.operation, i.entity, i.data, i.evidence, i.traces, i.status, i.first_seen, i.last_seen, "
        "i.occurrences",
        {"fp": FP},
    )
    e = finding("o2", T0 + 500)
    assert sorted(row[0]) == ["Finding", "Incident"]
    assert row[1:9] == [
        "sample_hang",
        "sample_hang",
        e.title,
        "high",
        "add_timeout",
        "checkout",
        "GET /checkout",
        "payments",
    ]  # fmt: skip  (the latest occurrence's, though an older one came last)
    assert json.loads(row[9]) == e.data and row[10] == e.evidence and row[11] == e.traces
    assert row[12:] == ["open", T0, T0 + 500, 2]
    on = await sink.query("MATCH (:Finding {fingerprint: $fp})-[:ON]->(o:Operation) RETURN o.key", {"fp": FP})
    assert on == [[operation_key_of("checkout", "GET /checkout")]]
    occurrences = await sink.query("MATCH (o:Occurrence)-[:OF]->(:Finding {fingerprint: $fp}) RETURN o.id, o.at "
                                   "ORDER BY o.at", {"fp": FP})  # fmt: skip
    assert occurrences == [["o1", T0], ["o2", T0 + 500]]

    await sink.record([verdict("FIXED", T0 + 10_000)])
    assert (await sink.query("MATCH (i:Finding {fingerprint: $fp}) RETURN i.status", {"fp": FP})) == [["fixed"]]
    await sink.record([finding("o3", T0 + 20_000)])  # back after the fix
    assert (await sink.query("MATCH (i:Finding {fingerprint: $fp}) RETURN i.status", {"fp": FP})) == [["open"]]


async def test_a_finding_without_an_operation_is_on_its_service_and_hostile_text_stays_data(sink: GraphSink) -> None:
    hostile = "x'}) MATCH (n) DETACH DELETE n //\" $rows"
    e = finding(fingerprint="fp-svc", subject=Subject(service=hostile), title=hostile, evidence=[hostile],
                data={"calls": 2, "hung": 1, "p95_ms": 3.0, "dependency": hostile})  # fmt: skip
    await sink.record([e])
    [[title, data, svc]] = await sink.query(
        "MATCH (i:Finding {fingerprint: 'fp-svc'})-[:ON]->(s:Service) RETURN i.title, i.data, s.name"
    )
    assert title == hostile and json.loads(data)["dependency"] == hostile and svc == hostile
    assert await sink.query("MATCH (n:Occurrence) RETURN count(n)") == [[1]]  # nothing was deleted


def test_a_type_may_render_its_own_graph_rows_for_a_record_of_the_schema() -> None:
    """The ``graph_rows`` lookup: a type's own renderer, else its kind's, else the generic ``finding`` row; a
    renderer naming a record the schema does not have is refused (the Cypher stays in the schema module)."""
    own = finding(type="sample_hang_rows")
    assert rows_of(finding())[0] == "finding" and rows_of(incident())[0] == "incident"
    register_renderer(GRAPH_ROWS, "sample_hang_rows", lambda e: ("finding", {**finding_row(e), "entity": "mine"}))
    try:
        assert rows_of(own) == ("finding", {**finding_row(own), "entity": "mine"})
        register_renderer(GRAPH_ROWS, "sample_hang_rows", lambda e: ("MATCH (n) DETACH DELETE n", {}))
        with pytest.raises(ValueError, match="names no record"):
            rows_of(own)
    finally:
        RENDERERS.pop((GRAPH_ROWS, "sample_hang_rows"))
