"""Requests to write into a graph in tests: spans of a ``checkout`` request whose DB span updates ``orders:8812``,
the access that DB span makes, and the access as an event carries it."""

from __future__ import annotations

from processors.model.events import Access, DbCall, DbOperation, LockMode, Resource, SpanKind, StatusCode
from processors.model.outputs import AccessInfo
from processors.model.span import Span

MS = 1_000_000
UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


def span(tid: str, sid: int, parent: int, name: str, *, db: bool = False, error: bool = False, t0_ms: int = 1_000,
         duration_ms: int = 50) -> Span:  # fmt: skip
    """Span ``sid`` (hex of the number) under ``parent`` (0: the root, the server span of the route), starting
    ``sid`` ms after ``t0_ms``; a ``db`` span is the client span of ``capture_payment``'s UPDATE."""
    return Span(
        trace_id=tid, span_id=f"{sid:016x}", parent_id=f"{parent:016x}" if parent else "", name=name,
        kind=SpanKind.SERVER if not parent else (SpanKind.CLIENT if db else SpanKind.INTERNAL),
        start_ns=(t0_ms + sid) * MS, end_ns=(t0_ms + sid + duration_ms) * MS,
        status=StatusCode.ERROR if error else StatusCode.UNSET, resource=Resource("checkout", "1.0"),
        route="/orders/{id}/capture" if not parent else "", code_function="capture_payment" if db else "",
        code_file="shop/pay.py" if db else "", db=DbCall("postgresql", UPDATE) if db else None,
    )  # fmt: skip


def update_of(db: Span) -> Access:
    """The write of ``orders:8812`` the DB span ``db`` makes."""
    return Access(entity="orders:8812", table="orders", operation=DbOperation.WRITE, lock=LockMode.NONE,
                  trace_id=db.trace_id, span_id=db.span_id, service="checkout", version="1.0", start_ns=db.start_ns,
                  end_ns=db.end_ns, statement=UPDATE, params=("paid", 8812), function="capture_payment",
                  file="shop/pay.py")  # fmt: skip


def info(a: Access) -> AccessInfo:
    """``a`` as an incident event carries it."""
    return AccessInfo(trace_id=a.trace_id, span_id=a.span_id, service=a.service, version=a.version,
                      function=a.function, file=a.file, route="/orders/{id}/capture", operation="UPDATE",
                      lock="none", statement=a.statement, params=list(a.params), set_values={},
                      start_unix_ms=a.start_ns / MS, offset_ms=0.0, error=False, exception="",
                      http_status=200)  # fmt: skip
