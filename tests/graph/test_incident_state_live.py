"""An Incident node's state on the real FalkorDB: first and last sighting, fixed by a FIXED verdict, reopened by a
later occurrence and by a later NOT_FIXED / WORSE verdict, whatever order the records arrive in."""

from __future__ import annotations

import pytest

from processors.connectors.proofs.contracts import ProofContract
from processors.model.outputs import IncidentEvent
from processors.model.verdict import Receipt, VerdictEvent
from sinks.graph.sink import GraphSink
from tests.graph.checkout_request import info
from tests.graph.test_paths_live import request

pytestmark = pytest.mark.engines

FP = "fp-state"
T0 = 1_000_000.0  # ms


def occurrence(name: str, at_ms: float) -> IncidentEvent:
    _, a = request("a" * 32, 10)
    _, b = request("b" * 32, 20)
    culprit = info(a).model_copy(update={"start_unix_ms": at_ms})
    return IncidentEvent(fingerprint=FP, occurrence=name, anomaly="lost_update", severity="high", manifest=True,
                         entity="orders:8812", table="orders", window_ms=2.0, summary=f"lost ({name})", damage="",
                         confidence=0.9, culprit=culprit, victim=info(b), writers=[culprit, info(b)],
                         accesses=[culprit, info(b)], commits=[], evidence=[],
                         detected_at_unix_ms=at_ms)  # fmt: skip


def verdict(outcome: str, window_end_ms: float) -> VerdictEvent:
    receipt = Receipt(before_errors=6, before_requests=12, after_errors=0, after_requests=20, test="exact",
                      p_value=0.003, interval=None, must_start_seen=20, still_happens_at=[], requests_needed=0,
                      window_start_unix_ms=window_end_ms - 60_000, window_end_unix_ms=window_end_ms)  # fmt: skip
    return VerdictEvent(fingerprint=FP, contract="lost_update:orders:f+f", service="checkout", version="1.1",
                        commit="abc", outcome=outcome, rollback=False, reason=outcome, receipt=receipt)  # fmt: skip


async def state(sink: GraphSink) -> list[object]:
    [row] = await sink.query("MATCH (i:Incident {fingerprint: $fp}) RETURN i.status, i.first_seen, i.last_seen",
                             {"fp": FP})  # fmt: skip
    return row


async def test_an_incident_is_fixed_by_its_verdict_and_reopened_only_by_what_comes_after(sink: GraphSink) -> None:
    contract = ProofContract(signature="lost_update:orders:f+f", fingerprint=FP, service="checkout")
    await sink.record([contract])  # the contract first: the Incident node exists before any occurrence
    await sink.record([occurrence("o2", T0 + 500)])
    await sink.record([occurrence("o1", T0)])  # an earlier occurrence written later
    assert await state(sink) == ["open", T0, T0 + 500]

    await sink.record([verdict("FIXED", T0 + 10_000)])
    assert (await state(sink))[0] == "fixed"
    await sink.record([occurrence("o3", T0 + 900)])  # replayed, or late: before the judged window ended
    assert await state(sink) == ["fixed", T0, T0 + 900]
    await sink.record([verdict("NOT_FIXED", T0 + 5_000)])  # a verdict on an older window changes nothing
    assert (await state(sink))[0] == "fixed"

    await sink.record([occurrence("o4", T0 + 20_000)])  # the defect is back after the fix
    assert await state(sink) == ["open", T0, T0 + 20_000]
    await sink.record([verdict("FIXED", T0 + 30_000)])
    assert (await state(sink))[0] == "fixed"
    await sink.record([verdict("WORSE", T0 + 40_000)])
    assert (await state(sink))[0] == "open"
