"""A week of event time through the graph sink on the real FalkorDB: every node label and relationship type stays
bounded once the longest retention horizon has passed (retention rules: ``sinks.graph.schema``, "retention").

Every simulated hour brings what a day of production brings in miniature: requests on new rows (detail under the
``paths`` policy, an access each, and their row changes, one credited to a span the graph never gets), a closed
window with CALLS and STATS contributions from two partitions, the proof judge's tallies, a build and a route per day
(services and operations come and go), an incident that keeps occurring every hour, and one new incident per day
with its contract and a verdict; every event is recorded as published. Retention runs after each hour, as stage 1
runs it (``GraphSink.expire_spans`` with the raw spans' cut-off).
"""

from __future__ import annotations

import pytest

from processors.connectors.proofs.contracts import ProofContract
from processors.graph.rows import GraphPolicyConfig, trace_rows
from processors.lib.sketch import LatencySketch
from processors.model.base import Published
from processors.model.events import Access, DbCall, DbOperation, LockMode, Resource, SpanKind, StatusCode
from processors.model.graph import GraphBatch
from processors.model.outputs import IncidentEvent
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.model.verdict import Receipt, VerdictEvent
from sinks.graph.schema import EXPIRE
from sinks.graph.sink import GraphSink
from tests.graph.checkout_request import info

pytestmark = pytest.mark.engines

MS_NS = 1_000_000
HOUR_MS = 3_600_000.0
DAY_MS = 24 * HOUR_MS
T0_MS = 1_780_000_000_000.0  # a Monday in 2026, event time
DAYS = 7
POLICY = GraphPolicyConfig(span_retention_s=6 * 3600, aggregate_retention_s=24 * 3600, incident_retention_s=48 * 3600,
                           published_retention_s=36 * 3600)  # fmt: skip
FLAT_FROM_DAY = 3  # the longest horizon (incidents, two days) has passed, with a day's margin for daily kinds
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


def _span(tid: str, sid: int, parent: int, at_ms: float, *, version: str, route: str = "", db: bool = False) -> Span:
    return Span(
        trace_id=tid, span_id=f"{sid:016x}", parent_id=f"{parent:016x}" if parent else "",
        name="db" if db else ("handler" if parent else "POST"), kind=SpanKind.CLIENT if db else SpanKind.SERVER,
        start_ns=int(at_ms * MS_NS), end_ns=int((at_ms + 20) * MS_NS), status=StatusCode.UNSET,
        resource=Resource("checkout", version), route=route, code_function="capture" if db else "",
        db=DbCall("postgresql", UPDATE) if db else None,
    )  # fmt: skip


class Week:
    """Builds each simulated hour's batch and events (see the module docstring)."""

    def __init__(self) -> None:
        self.order = 0
        self.span = 0
        self.lsn = 0
        self.hot = 0  # occurrences of the incident that keeps occurring

    def _request(self, at_ms: float, version: str, route: str, batch: GraphBatch) -> Access:
        self.order += 1
        tid = f"{self.order:032x}"
        root, handler, db = self.span + 1, self.span + 2, self.span + 3
        self.span += 3
        spans = (_span(tid, db, handler, at_ms + 2, version=version, db=True),
                 _span(tid, handler, root, at_ms + 1, version=version),
                 _span(tid, root, 0, at_ms, version=version, route=route))  # fmt: skip
        access = Access(entity=f"orders:{self.order}", table="orders", operation=DbOperation.WRITE,
                        lock=LockMode.NONE, trace_id=tid, span_id=spans[0].span_id, service="checkout",
                        version=version, start_ns=spans[0].start_ns, end_ns=spans[0].end_ns, statement=UPDATE,
                        params=("paid", self.order), function="capture", file="shop/pay.py")  # fmt: skip
        trace_rows(ClosedTrace(tid, spans, part="spans/0"), [access], "paths", batch)
        self.lsn += 1
        batch.changes.append({"entity": access.entity, "table": "orders", "lsn": self.lsn, "tx": str(self.lsn),
                              "commit_ms": at_ms + 3, "op": "u", "before": '{"status":"new"}',
                              "after": '{"status":"paid"}', "span": access.span_id, "strength": "trace_id",
                              "skew_ms": 0.0})  # fmt: skip
        return access

    def hour(self, h: int) -> tuple[GraphBatch, list[Published]]:
        at = T0_MS + h * HOUR_MS
        day = h // 24
        version, route = f"1.{day}", f"/v{day}/orders/{{id}}/capture"
        batch = GraphBatch(tables=[{"name": "orders", "key": ["id"]}])
        a = self._request(at, version, route, batch)
        b = self._request(at + 1_000, version, route, batch)
        self.lsn += 1  # a change credited to a span the graph never gets (a placeholder Span)
        batch.changes.append({"entity": "orders:lost", "table": "orders", "lsn": self.lsn, "tx": str(self.lsn),
                              "commit_ms": at + 5, "op": "u", "before": None, "after": '{"status":"x"}',
                              "span": f"ffff{h:012x}", "strength": "values", "skew_ms": 1.0})  # fmt: skip
        window = f"{at:.0f}-{at + HOUR_MS:.0f}"
        batch.windows.append({"id": window, "start": at, "end": at + HOUR_MS})
        sketch = LatencySketch()
        sketch.add(20.0)
        for part in ("spans/0", "spans/1"):
            batch.calls.append({"caller": "checkout", "callee": "postgresql", "window": window, "end": at + HOUR_MS,
                                "part": part, "count": 2, "errors": 0, **sketch.to_row()})  # fmt: skip
            batch.stats.append({"service": "checkout", "operation_key": f"checkout:{route}", "operation": route,
                                "window": window, "start": at, "end": at + HOUR_MS, "version": version, "part": part,
                                "revision": "", "requests": 2, "errors": 0, "signatures": "{}", "path_ns": "{}",
                                **sketch.to_row()})  # fmt: skip
            batch.tallies.append({"key": f"checkout|{version}|{part}", "service": "checkout", "version": version,
                                  "part": part, "revision": "", "first_ns": int(T0_MS + day * DAY_MS) * MS_NS,
                                  "last_ns": int(at) * MS_NS, "settled_until": int(at) * MS_NS, "json": "{}",
                                  "updated": at})  # fmt: skip
        batch.services.append({"name": "postgresql", "seen": at + HOUR_MS})
        self.hot += 1
        events: list[Published] = [self._incident("hot", f"hot-{h}", a, b, at)]
        if h % 24 == 0:
            fp = f"daily-{day}"
            events += [self._incident(fp, f"{fp}-0", a, b, at), self._contract(fp, at), self._verdict(fp, at)]
        return batch, events

    @staticmethod
    def _incident(fp: str, occurrence: str, a: Access, b: Access, at: float) -> IncidentEvent:
        culprit = info(a).model_copy(update={"start_unix_ms": at})
        victim = info(b).model_copy(update={"start_unix_ms": at + 1_000})
        return IncidentEvent(fingerprint=fp, occurrence=occurrence, anomaly="lost_update", severity="high",
                             manifest=True, entity=a.entity, table="orders", window_ms=2.0, summary="lost", damage="",
                             confidence=0.9, culprit=culprit, victim=victim, writers=[culprit, victim],
                             accesses=[culprit, victim], commits=[], evidence=[], detected_at_unix_ms=at)  # fmt: skip

    @staticmethod
    def _contract(fp: str, at: float) -> ProofContract:
        return ProofContract(signature=f"lost_update:{fp}", fingerprint=fp, service="checkout", created_unix_ms=at)

    @staticmethod
    def _verdict(fp: str, at: float) -> VerdictEvent:
        receipt = Receipt(before_errors=6, before_requests=12, after_errors=0, after_requests=20, test="exact",
                          p_value=0.003, interval=None, must_start_seen=20, still_happens_at=[], requests_needed=0,
                          window_start_unix_ms=at, window_end_unix_ms=at + HOUR_MS)  # fmt: skip
        return VerdictEvent(fingerprint=fp, contract=f"lost_update:{fp}", service="checkout", version="1.1",
                            commit="abc", outcome="FIXED", rollback=False, reason="fixed", receipt=receipt)  # fmt: skip


async def _census(sink: GraphSink) -> dict[str, int]:
    nodes = await sink.query("MATCH (n) RETURN labels(n)[0], count(n)")
    edges = await sink.query("MATCH ()-[r]->() RETURN type(r), count(r)")
    return {str(k): int(n) for k, n in nodes} | {f"-[{k}]->": int(n) for k, n in edges}


async def test_a_week_of_traffic_leaves_every_label_and_edge_type_bounded(sink: GraphSink) -> None:
    """Node and edge counts per label and type, sampled at the end of each simulated day: from day 3 on (past the
    longest horizon) no kind holds more than it did at the end of day 3, every kind is still there, and the incident
    that kept occurring counts all of its occurrences though only the last two days' are still nodes."""
    clock = [T0_MS]
    sink._clock_ms = lambda: clock[0]
    sink.retention = POLICY
    week = Week()
    daily: list[dict[str, int]] = []
    for h in range(DAYS * 24):
        batch, events = week.hour(h)
        clock[0] = T0_MS + (h + 1) * HOUR_MS
        await sink.write_batch(batch)
        await sink.record(await sink.unseen(events))
        await sink.expire_spans(clock[0] - POLICY.span_retention_s * 1000)
        if h % 24 == 23:
            daily.append(await _census(sink))
    flat, last = daily[FLAT_FROM_DAY - 1], daily[-1]
    grew = {k: [day.get(k, 0) for day in daily] for k in set().union(*daily)
            if max(day.get(k, 0) for day in daily[FLAT_FROM_DAY - 1 :]) > flat.get(k, 0)}  # fmt: skip
    assert not grew, f"kinds still growing after day {FLAT_FROM_DAY} (count at the end of each day): {grew}"
    kinds = {"Trace", "Span", "Entity", "Window", "Service", "Operation", "Incident", "Occurrence", "Contract",
             "Verdict", "Tally", "Published", "Table", "-[CALLS]->", "-[CALLS_PART]->", "-[STATS]->",
             "-[STATS_PART]->", "-[OF]->", "-[CHILD_OF]->", "-[WROTE]->", "-[EXPOSES]->", "-[ON]->", "-[FOR]->",
             "-[JUDGES]->"}  # fmt: skip
    assert kinds <= {k for k, n in last.items() if n}, f"kinds gone altogether: {kinds - set(last)}"
    [[occurrences, nodes]] = await sink.query(
        "MATCH (i:Incident {fingerprint: 'hot'})<-[:OF]-(o:Occurrence) RETURN i.occurrences, count(o)"
    )
    assert occurrences == week.hot == DAYS * 24 and nodes <= 2 * 24 + 1
    assert await sink.query("MATCH (i:Incident) WHERE i.fingerprint STARTS WITH 'daily' RETURN count(i)") == [[2]]


def test_the_policy_has_a_horizon_for_every_rule() -> None:
    """Every retention rule names a horizon the policy has."""
    horizons = GraphPolicyConfig().retentions_s()
    assert {horizon for _, horizon, _ in EXPIRE} <= set(horizons)
