"""The feature's Cypher statements on a real FalkorDB: STATS edges, regression incidents, contracts, verdicts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from falkordb import FalkorDB

from processors.connectors.proofs.judge import ProofJudge
from processors.detectors.regressions.detector import RegressionDetector
from processors.detectors.regressions.stats import ServiceStats, stats_rows
from processors.model.contract import ProofContract
from processors.model.outputs import VerdictEvent
from sinks.graph import schema
from sinks.graph.records import contract_row, regression_row, verdict_row
from tests.regressions.builders import MS, T0, S, log, request

pytestmark = pytest.mark.engines


@pytest.fixture
def graph(falkordb_url: str) -> Iterator[Any]:
    """A fresh graph of its own, deleted afterwards."""
    host, port = falkordb_url.removeprefix("redis://").split(":")
    g = FalkorDB(host=host, port=int(port)).select_graph(f"regressions_{uuid.uuid4().hex[:8]}")
    try:
        yield g
    finally:
        g.delete()


def _rows(graph: Any, cypher: str) -> list[list[Any]]:
    return [list(r) for r in graph.query(cypher).result_set]


def _feature_rows() -> dict[str, list[dict[str, Any]]]:
    """Two windows of split traffic (0.9 clean, 1.0 failing), the regression, its contract and a verdict."""
    stats = ServiceStats(10 * S, S)
    detector = RegressionDetector()
    judge = ProofJudge()
    out: dict[str, list[dict[str, Any]]] = {"stats": [], "regressions": [], "contracts": [], "verdicts": []}
    for w, (version, errors) in enumerate((("0.9", 0), ("1.0", 20), ("1.2", 0))):
        for i in range(200):
            at = T0 + w * 10 * S + i * 40 * MS
            trace = request(at, version, exception="RoundingError" if i < errors else "")
            stats.add(trace)
            judge.on_trace(trace)
            if version == "1.2" and i % 10 == 0:
                judge.on_log(log(at, version, "split.rounded"))
        for window in stats.close_until(T0 + (w + 2) * 10 * S):
            out["stats"] += stats_rows(window)
            for event in detector.on_window(window).regressions:
                out["regressions"].append(regression_row(event))
                contract = ProofContract(signature="error:*:RoundingError", fingerprint=event.fingerprint,
                                         must_start="split.rounded", min_requests=59, service="split",
                                         version="1.0")  # fmt: skip
                judge.on_contract(contract)
                out["contracts"].append(contract_row(contract))
    verdicts: list[VerdictEvent] = judge.close_until(T0 + 100 * S)
    out["verdicts"] = [verdict_row(v) for v in verdicts]
    return out


def test_statements_write_the_feature_subgraph_idempotently(graph: Any) -> None:
    """STATS per version and window, the regression on its Operation, Contract FOR Incident, Verdict JUDGES Contract;
    writing everything twice changes nothing."""
    rows = _feature_rows()
    assert rows["regressions"] and rows["verdicts"]
    for _ in range(2):
        graph.query(schema.UPSERTS["operations"], {"rows": [{"key": "split:/split/even", "service": "split",
                                                         "name": "/split/even"}]})  # fmt: skip
        graph.query(schema.UPSERTS["stats"], {"rows": rows["stats"]})
        graph.query(schema.RECORDS["regression"], {"rows": rows["regressions"]})
        graph.query(schema.RECORDS["contract"], {"rows": rows["contracts"]})
        graph.query(schema.RECORDS["verdict"], {"rows": rows["verdicts"]})
    stats = _rows(graph, "MATCH (s:Service)-[:EXPOSES]->(o:Operation)-[x:STATS_PART]->(w:Window) "
                         "RETURN s.name, o.key, x.version, x.requests, x.errors ORDER BY x.version")  # fmt: skip
    assert stats == [["split", "split:/split/even", "0.9", 200, 0], ["split", "split:/split/even", "1.0", 200, 20],
                     ["split", "split:/split/even", "1.2", 200, 0]]  # fmt: skip
    assert _rows(graph, "MATCH (o:Operation) RETURN count(o)") == [[1]]
    incident = _rows(graph, "MATCH (x:Occurrence)-[:OF]->(i:Incident {class: 'regression'})-[:ON]->(o:Operation) "
                            "RETURN i.signature, i.occurrences, x.version, o.key")  # fmt: skip
    assert incident == [["error:POST /split/even:RoundingError", 1, "1.0", "split:/split/even"]]
    verdicts = _rows(graph, "MATCH (v:Verdict)-[:JUDGES]->(c:Contract)-[:FOR]->(i:Incident) "
                            "RETURN v.version, v.outcome, c.must_start, i.class")  # fmt: skip
    assert verdicts == [["1.2", "FIXED", "split.rounded", "regression"]]
