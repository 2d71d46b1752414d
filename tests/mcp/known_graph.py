"""A known graph for the MCP tests, written by the real graph sink: a small topology, two builds of one operation
with their critical paths, a lost-update incident with its two requests, its repro, a contract and a verdict.

Topology (calls in each of two windows)::

    gateway -100-> frontend -80-> checkout -50-> payments  -50-> postgresql
                            -20-> cache    -30-> inventory -30-> postgresql

``frontend`` is on every path of ``gateway`` (its single point of failure); ``checkout`` is not (``cache`` is a
leaf reached without it). Of the p95 tail of ``checkout:POST /checkout``, version 1.0 spends 60% in checkout and
40% in postgresql; version 2.0 20% and 80%.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from processors.graph.rows import trace_rows
from processors.lib.sketch import LatencySketch
from processors.model.contract import ProofContract
from processors.model.events import Access
from processors.model.graph import GraphBatch
from processors.model.outputs import IncidentEvent, ReproEvent, RunInfo
from processors.model.repro import DivergenceInfo, RepairInfo
from processors.model.trace import ClosedTrace
from processors.model.verdict import Receipt, VerdictEvent
from sinks.graph.sink import GraphSink
from tests.graph.checkout_request import info, span, update_of

T0 = 1_700_000_000_000  # ms
W1, W2 = f"{T0}-{T0 + 60_000}", f"{T0 + 60_000}-{T0 + 120_000}"
FP = "0123456789abcdef"
EDGES = [("gateway", "frontend", 100), ("frontend", "checkout", 80), ("frontend", "cache", 20),
         ("checkout", "payments", 50), ("checkout", "inventory", 30), ("payments", "postgresql", 50),
         ("inventory", "postgresql", 30)]  # fmt: skip
PATHS = {W1: ("1.0", {"checkout": 600, "postgresql": 400}), W2: ("2.0", {"checkout": 200, "postgresql": 800})}
VERDICT_KEY = f"{FP}|checkout|2.0|FIXED"


@dataclass(frozen=True)
class KnownGraph:
    url: str
    graph: str
    repro_dir: Path
    test_path: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a ``trace-repro mcp`` subprocess on this graph."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith("TRACE_REPRO_")}
        return keep | {"TRACE_REPRO_FALKORDB_URL": self.url, "TRACE_REPRO_FALKORDB__GRAPH": self.graph,
                       "TRACE_REPRO_REPRO__OUTPUT_DIR": str(self.repro_dir)} | extra  # fmt: skip


def _sketch(ms: float, n: int) -> dict[str, object]:
    s = LatencySketch()
    for _ in range(n):
        s.add(ms)
    return s.to_row()


def _request(tid: str, base: int) -> tuple[ClosedTrace, Access]:
    spans = (span(tid, base + 2, base + 1, "db", db=True, t0_ms=T0, duration_ms=5),
             span(tid, base + 1, 0, "POST /orders/{id}/capture", t0_ms=T0, duration_ms=5))  # fmt: skip
    return ClosedTrace(tid, spans), update_of(spans[0])


def topology_batch() -> GraphBatch:
    """The CALLS and STATS contributions of the known topology (two windows, one partition each)."""
    batch = GraphBatch()
    for i, w in enumerate((W1, W2)):
        batch.windows.append({"id": w, "start": T0 + i * 60_000, "end": T0 + (i + 1) * 60_000})
        for caller, callee, n in EDGES:
            batch.calls.append({"caller": caller, "callee": callee, "window": w, "part": "spans/0", "count": n,
                                "errors": 1 if callee == "postgresql" else 0, **_sketch(10.0, n)})  # fmt: skip
        version, path = PATHS[w]
        batch.stats.append({"service": "checkout", "operation": "POST /checkout", "operation_key":
                            "checkout:POST /checkout", "window": w, "start": T0 + i * 60_000,
                            "end": T0 + (i + 1) * 60_000, "version": version, "part": "spans/0", "revision": "",
                            "requests": 80, "errors": 0, "signatures": "{}",
                            "path_ns": json.dumps(path), **_sketch(20.0 + 30 * i, 80)})  # fmt: skip
    names = sorted({c for e in EDGES for c in e[:2]})
    batch.services.extend({"name": n} for n in names)
    batch.operations.append({"key": "checkout:POST /checkout", "service": "checkout", "name": "POST /checkout"})
    return batch


async def write_known_graph(sink: GraphSink, repro_dir: Path) -> Path:
    await sink.write_batch(topology_batch())
    culprit, a = _request("a" * 32, 10)
    victim, b = _request("b" * 32, 20)
    batch = GraphBatch()
    trace_rows(culprit, [a], "paths", batch)
    trace_rows(victim, [b], "paths", batch)
    await sink.write_batch(batch)
    incident = IncidentEvent(fingerprint=FP, occurrence="o1", anomaly="lost_update", severity="high",
                             manifest=True, entity="orders:8812", table="orders", window_ms=10.0,
                             summary="capture_payment lost an update to orders:8812", damage="", confidence=0.9,
                             culprit=info(a), victim=info(b), writers=[info(a), info(b)],
                             accesses=[info(a), info(b)], commits=[], evidence=[],
                             detected_at_unix_ms=1.0)  # fmt: skip
    contract = ProofContract(signature="lost_update:orders:capture_payment+capture_payment", fingerprint=FP,
                             must_start="orders.locked", service="checkout", created_unix_ms=T0)  # fmt: skip
    receipt = Receipt(before_errors=7, before_requests=100, after_errors=0, after_requests=400, test="exact binomial",
                      p_value=0.0004, interval=None, must_start_seen=400, still_happens_at=[], requests_needed=0,
                      window_start_unix_ms=T0, window_end_unix_ms=T0 + 120_000)  # fmt: skip
    verdict = VerdictEvent(fingerprint=FP, contract=contract.signature, service="checkout", version="2.0",
                           commit="abc123", outcome="FIXED", rollback=False, reason="no lost update in 400 requests",
                           receipt=receipt)  # fmt: skip
    await sink.record([incident, contract, verdict])
    test_path = repro_dir / FP / f"test_repro_{FP}.py"
    test_path.parent.mkdir(parents=True)
    test_path.write_text("def test_lost_update():\n    assert 1 + 1 == 3, 'the second writer overwrote the first'\n")
    green = repro_dir / "work" / FP / "green" / f"test_repro_{FP}.py"  # as the repro worker leaves its GREEN run
    green.parent.mkdir(parents=True)
    green.write_text("import os\n\ndef test_lost_update():\n    assert os.environ['REPRO_SOURCE_ROOT'].endswith('x')\n")
    (repro_dir / "work" / FP / "repro-green-x").mkdir()  # the repaired copy of the source
    repro = ReproEvent(fingerprint=FP, occurrence="o1", anomaly="lost_update", level="sql",
                       test_path=str(test_path), test_source=test_path.read_text(),
                       red=RunInfo(status="failed", failure="lost", duration_ms=5.0),
                       green=RunInfo(status="passed", failure="", duration_ms=5.0), patch="",
                       repairs=[RepairInfo(strategy="row_lock", file="shop/pay.py", function="capture_payment",
                                           statement_before="SELECT * FROM orders WHERE id = %s",
                                           statement_after="SELECT * FROM orders WHERE id = %s FOR UPDATE",
                                           lock_before="none", lock_after="for_update")],
                       sql_rewrites=[], divergence=DivergenceInfo(faithful=True, index=None, expected=None,
                                                                  actual=None, mismatch=None),
                       proven=True)  # fmt: skip
    await sink.record_repro(repro)
    return test_path
