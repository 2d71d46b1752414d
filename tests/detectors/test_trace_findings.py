"""What the per-trace detectors share: partitions merged and revoked, a failing finding quarantined, late traces."""

from __future__ import annotations

import pytest

from processors.api.component import Emit
from processors.api.telemetry import Telemetry
from processors.detectors.n_plus_one import NPlusOneConfig, NPlusOneData, NPlusOneDetector
from processors.model.finding import FindingEvent, data_of
from processors.pipeline.critical_path import critical_path, on_path, owner
from tests.detectors.test_n_plus_one import looping
from tests.detectors.trace_kit import GAP_NS, MS, T0, WINDOW_NS, Request, close_all


def detector() -> NPlusOneDetector:
    return NPlusOneDetector(NPlusOneConfig(), WINDOW_NS, GAP_NS, telemetry=Telemetry("trace_findings_test"))


def test_partitions_add_up_and_a_revoked_one_goes() -> None:
    """Two input partitions' loops make one finding with both counted; a revoked partition's contribution goes."""
    d = detector()
    for i in range(4):
        d.on_trace(looping(i).trace(part=f"otlp_spans/{i % 2}"), ())
    [both] = close_all(d)
    assert data_of(both, NPlusOneData).requests == 4
    d = detector()
    for i in range(4):
        d.on_trace(looping(i).trace(part=f"otlp_spans/{i % 2}"), ())
    d.on_revoke("otlp_spans/1")
    [kept] = close_all(d)
    assert data_of(kept, NPlusOneData).requests == 2 and kept.occurrence != both.occurrence


def test_a_finding_that_fails_to_build_is_quarantined_the_others_go_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """One fingerprint whose finding raises is reported in ``quarantined``; the window's other findings are emitted."""
    d = detector()
    d.on_trace(looping(1).trace(), ())
    other = Request("/cart", T0 + MS)
    for k in range(6):
        other.db("SELECT * FROM carts WHERE id = %s", 1 + 5 * k, 4, (k,))
    d.on_trace(other.trace(), ())
    build = d.finding

    def failing(window, fingerprint, tally):  # type: ignore[no-untyped-def]
        if tally.operation == "/cart":
            raise RuntimeError("boom")
        return build(window, fingerprint, tally)

    monkeypatch.setattr(d, "finding", failing)
    out = Emit()
    d.on_watermark(T0 + 100 * WINDOW_NS, None, out)
    assert [e.subject.operation for e in out.events if isinstance(e, FindingEvent)] == ["/orders/{id}"]
    assert [str(q.error) for q in out.quarantined] == ["boom"]


def test_a_trace_for_a_closed_window_is_late_and_counted() -> None:
    """A trace whose window has been emitted is left out and counted as late, never a second partial finding."""
    d = detector()
    d.on_trace(looping(1).trace(), ())
    assert len(close_all(d)) == 1
    d.on_trace(looping(2).trace(), ())
    assert close_all(d) == []
    assert d.telemetry.dropped["n_plus_one_late"] == 1


def test_on_path_partitions_the_request_as_critical_path_does() -> None:
    """Per-span critical-path time sums to the request's duration and, summed by owner, is ``critical_path``."""
    r = Request("/dashboard", T0)
    for c in range(6):
        r.call("pricing", "/price/{sku}", 1 + (c // 2) * 41, 40)
    r.db("SELECT 1", 130, 5)
    t = r.trace()
    per_span = on_path(t.spans, t.root)
    assert sum(per_span.values()) == t.root.end_ns - t.root.start_ns
    by_owner: dict[str, int] = {}
    for s in t.spans:
        if s.span_id in per_span:
            by_owner[owner(s)] = by_owner.get(owner(s), 0) + per_span[s.span_id]
    assert by_owner == critical_path(t.spans, t.root)


def test_requests_per_operation_are_counted_up_to_the_bound_and_the_rest_dropped() -> None:
    """A window counts the requests of ``max_operations`` operations; a known one is counted past the bound, each
    request of another is dropped and counted (``max_operations``)."""
    d = NPlusOneDetector(NPlusOneConfig(max_operations=2), WINDOW_NS, GAP_NS, telemetry=Telemetry("bound_test"))
    for route in ("/a", "/b", "/c", "/a", "/c", "/b"):
        part = d.windows.window(Request(route, T0 + MS).trace())
    assert part is not None and part.requests == {("shop", "/a"): 2, ("shop", "/b"): 2}
    assert d.telemetry.dropped["max_operations"] == 2
