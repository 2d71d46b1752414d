"""accesses_of / with_request: every access of a closed trace carries its code site and its request."""

from __future__ import annotations

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace
from processors.pipeline.accesses import accesses_of
from processors.sql import SqlAccessExtractor

MS = 1_000_000
T = "cd" * 16


def span(sid: int, parent: int, start_ms: int, end_ms: int, **kw: object) -> Span:
    return Span(trace_id=T, span_id=f"{sid:016x}", parent_id=f"{parent:016x}" if parent else "", name=f"s{sid}",
                kind=kw.pop("kind", SpanKind.INTERNAL), start_ns=start_ms * MS, end_ns=end_ms * MS,  # type: ignore[arg-type]
                status=kw.pop("status", StatusCode.UNSET), resource=Resource("shop", "2.0"), **kw)  # type: ignore[arg-type]  # fmt: skip


def test_each_access_is_stamped_with_its_request_and_keeps_its_own_fields() -> None:
    """Route, the request's interval (to the trace's last end), outcome, first exception, status, sorted links."""
    update = DbCall("postgresql", "UPDATE orders SET status = %s WHERE id IN (%s, %s)", params=("paid", 7, 8))
    spans = (
        span(1, 0, 1_000, 1_050, kind=SpanKind.SERVER, route="/pay", http_status=502, links=("f" * 32,)),
        span(2, 1, 1_010, 1_030, code_function="pay", code_file="shop/pay.py", links=("e" * 32,)),
        span(3, 2, 1_012, 1_020, kind=SpanKind.CLIENT, db=update),
        span(4, 1, 1_040, 1_090, status=StatusCode.ERROR, exception_type="Timeout"),  # ends after the root
    )
    accesses = accesses_of(ClosedTrace(T, spans), SqlAccessExtractor(key_columns={"orders": ["id"]}))
    assert [a.entity for a in accesses] == ["orders:7", "orders:8"]
    for a in accesses:
        assert (a.route, a.request_start_ns, a.request_end_ns) == ("/pay", 1_000 * MS, 1_090 * MS)
        assert (a.trace_error, a.trace_exception, a.trace_status) == (True, "Timeout", 502)
        assert a.links == ("e" * 32, "f" * 32)
        assert (a.span_id, a.start_ns, a.end_ns, a.function, a.file) == (f"{3:016x}", 1_012 * MS, 1_020 * MS, "pay",
                                                                          "shop/pay.py")  # fmt: skip
        assert a.set_values == (("status", "paid"),) and a.service == "shop" and a.version == "2.0"
