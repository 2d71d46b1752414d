"""Incidents of the classes over two rows (and the invariant violation without an invariant), built the way the
pipeline builds them: each recorded statement is a DB client span analysed by the daemon's ``SqlAccessExtractor``
(table keys learned from Debezium's message keys, as with the shipped configuration), stamped with its request
like ``processors.pipeline.accesses.with_request``, fed to the real ``CollisionDetector`` with the row changes
credited to it, and published with ``incident_event``.

The scenarios and their code live in ``tests/repair/clinic`` (on-call doctors, room bookings, ledger transfers) and
in the sample shop (``bench/shop``: the checkout oversell, the double charge).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import count
from pathlib import Path
from typing import Any

from processors.detectors.collisions import CollisionDetector
from processors.detectors.collisions.incident import incident_event
from processors.lib.invariants import compile_invariants
from processors.model.events import Access, CdcOp, Commit, DbCall, Resource, RowChange, Scalar, SpanKind, StatusCode
from processors.model.outputs import IncidentEvent
from processors.model.span import Span
from processors.sql import SqlAccessExtractor

MS = 1_000_000
T0 = 1_800_000_000_000 * MS
REPO = Path(__file__).resolve().parents[2]
SHOP = REPO / "bench" / "shop"
CLINIC = REPO / "tests" / "repair" / "clinic"

# The clinic's schema (``tests/repair/clinic/schema.sql``): doctors on call, and a ledger of accounts.
CLINIC_SCHEMA = (CLINIC / "schema.sql").read_text(encoding="utf-8")


@dataclass
class Trace:
    """One request: its statements (accesses) and how it ended."""

    letter: str
    function: str
    file: str
    failed: str = ""  # the exception the request ended with
    status: int = 200
    accesses: list[Access] = field(default_factory=list)

    @property
    def trace_id(self) -> str:
        return (self.letter * 32)[:32]


class Recorder:
    """Spans in, incidents out: stage 1's SQL analysis and stage 2's collision detector, without Kafka."""

    def __init__(self, *, keys: dict[str, list[str]], invariants: dict[str, list[str]] | None = None) -> None:
        self.extractor = SqlAccessExtractor()
        for table, columns in keys.items():  # what Debezium's message keys teach stage 1
            self.extractor.keys.learn(RowChange(f"public.{table}", CdcOp.READ, tuple((c, 0) for c in columns),
                                                None, {}, 0, 0, 0, ""))  # fmt: skip
        compiled = compile_invariants(invariants) if invariants else None
        self.detector = CollisionDetector(window_ns=500 * MS, settle_ns=0, invariants=compiled)
        self.spans = count(1)
        self.lsn = 100

    def trace(self, letter: str, function: str, file: Path, *, failed: str = "", status: int = 200) -> Trace:
        return Trace(letter, function, str(file), failed, status if not failed else 500)

    def statement(self, trace: Trace, at_ms: float, sql: str, params: tuple[Scalar, ...] = ()) -> Access:
        """One statement of ``trace``, at ``at_ms``, lasting a millisecond: its access (the extractor's)."""
        start = T0 + int(at_ms * MS)
        span = Span(
            trace_id=trace.trace_id, span_id=f"{next(self.spans):016x}", parent_id="", name=sql.split()[0],
            kind=SpanKind.CLIENT, start_ns=start, end_ns=start + MS, status=StatusCode.UNSET,
            resource=Resource("clinic" if "clinic" in trace.file else "shop", "1.0.0"), code_function=trace.function,
            code_file=trace.file, db=DbCall(system="postgresql", statement=sql, params=params),
        )  # fmt: skip
        found = self.extractor.accesses(span)
        assert len(found) == 1, (sql, found)
        trace.accesses.append(found[0])
        return found[0]

    def close(self, *traces: Trace) -> None:
        """The traces closed: every access stamped with its request (``with_request``), then to stage 2."""
        for t in traces:
            start = min(a.start_ns for a in t.accesses) - 5 * MS
            end = max(a.end_ns for a in t.accesses) + 60 * MS
            for a in t.accesses:
                self.detector.on_access(replace(
                    a, route=f"/{t.function.rsplit('.', 1)[-1]}", request_start_ns=start, request_end_ns=end,
                    trace_error=bool(t.failed), trace_exception=t.failed, trace_status=t.status,
                ))  # fmt: skip

    def commit(self, by: Access, table: str, key: dict[str, Any], before: dict[str, Any] | None,
               after: dict[str, Any] | None, at_ms: float, *, tx: str = "") -> None:  # fmt: skip
        """A row change Debezium delivered, credited to the statement that made it (values and time)."""
        self.lsn += 1
        op = CdcOp.CREATE if before is None else CdcOp.DELETE if after is None else CdcOp.UPDATE
        change = RowChange(f"public.{table}", op, tuple(key.items()), before, after, T0 // MS + int(at_ms), 0,
                           self.lsn, tx or str(self.lsn))  # fmt: skip
        self.detector.on_commit(change.entity_key, Commit(change, by.trace_id, by.span_id, "values_time", 0.4))

    def incidents(self) -> list[IncidentEvent]:
        until = T0 + 10_000 * MS
        return [incident_event(c, until) for c in self.detector.close_until(until)]


# ---- write skew: two doctors go off call at once, each having counted two on call ------------------------------
COUNT_ON_CALL = "SELECT count(*) FROM doctors WHERE shift = %s AND on_call"
OFF_CALL = "UPDATE doctors SET on_call = false WHERE name = %s"
GO_OFF_CALL = "clinic.oncall.go_off_call"


def write_skew(root: Path = REPO) -> IncidentEvent:
    """alice and bob, the last two on call for shift 1, both go off call: each counted 2, both committed."""
    r = Recorder(keys={"doctors": ["name"]})
    file = root / "tests" / "repair" / "clinic" / "oncall.py"
    a, b = r.trace("a", GO_OFF_CALL, file), r.trace("b", GO_OFF_CALL, file)
    r.statement(a, 0, COUNT_ON_CALL, (1,))
    r.statement(b, 1, COUNT_ON_CALL, (1,))
    wa = r.statement(a, 3, OFF_CALL, ("alice",))
    wb = r.statement(b, 4, OFF_CALL, ("bob",))
    r.close(a, b)
    r.commit(wa, "doctors", {"name": "alice"}, {"name": "alice", "shift": 1, "on_call": True},
             {"name": "alice", "shift": 1, "on_call": False}, 20)  # fmt: skip
    r.commit(wb, "doctors", {"name": "bob"}, {"name": "bob", "shift": 1, "on_call": True},
             {"name": "bob", "shift": 1, "on_call": False}, 21)  # fmt: skip
    [incident] = r.incidents()
    return incident


# ---- phantom: the shop's double charge (a client retry racing the original request) ----------------------------
FIND_CHARGE = "SELECT id FROM charges WHERE order_id = %s"
INSERT_CHARGE = "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id"
CHARGE = "shop.handlers.charge"


def phantom(root: Path = REPO, order: int = 1009, amount: int = 4200) -> IncidentEvent:
    """Both requests find no charge for the order and insert one: two charges; the provider refuses the second."""
    r = Recorder(keys={"charges": ["id"]})
    file = root / "bench" / "shop" / "handlers.py"
    a = r.trace("e", CHARGE, file)
    b = r.trace("f", CHARGE, file, failed="bench.shop.errors.IdempotencyKeyReused")
    r.statement(a, 0, FIND_CHARGE, (order,))
    r.statement(b, 1, FIND_CHARGE, (order,))
    ia = r.statement(a, 3, INSERT_CHARGE, (order, amount))
    ib = r.statement(b, 4, INSERT_CHARGE, (order, amount))
    r.close(a, b)
    charge = {"order_id": order, "amount": amount, "idempotency_key": None}
    r.commit(ia, "charges", {"id": 17}, None, {"id": 17, **charge}, 20)
    r.commit(ib, "charges", {"id": 18}, None, {"id": 18, **charge}, 21)
    [incident] = r.incidents()
    return incident


# ---- phantom without an idempotency key: two guests book one room for one day ------------------------------------
FIND_BOOKING = "SELECT id FROM bookings WHERE room = %s AND day = %s"
INSERT_BOOKING = "INSERT INTO bookings (room, day, guest) VALUES (%s, %s, %s) RETURNING id"
BOOK = "clinic.bookings.book"


def double_booking(root: Path = REPO) -> IncidentEvent:
    """ann and bo book room 5 on one day; both find it free, both get it."""
    r = Recorder(keys={"bookings": ["id"]})
    file = root / "tests" / "repair" / "clinic" / "bookings.py"
    a, b = r.trace("i", BOOK, file), r.trace("j", BOOK, file)
    r.statement(a, 0, FIND_BOOKING, (5, "2026-12-01"))
    r.statement(b, 1, FIND_BOOKING, (5, "2026-12-01"))
    ia = r.statement(a, 3, INSERT_BOOKING, (5, "2026-12-01", "ann"))
    ib = r.statement(b, 4, INSERT_BOOKING, (5, "2026-12-01", "bo"))
    r.close(a, b)
    r.commit(ia, "bookings", {"id": 1}, None, {"id": 1, "room": 5, "day": "2026-12-01", "guest": "ann"}, 20)
    r.commit(ib, "bookings", {"id": 2}, None, {"id": 2, "room": 5, "day": "2026-12-01", "guest": "bo"}, 21)
    [incident] = r.incidents()
    return incident


# ---- read skew: an audit reads one account before a transfer commits and the other after it --------------------
READ_BALANCE = "SELECT balance FROM ledger WHERE acct = %s"
DEBIT = "UPDATE ledger SET balance = balance - %s WHERE acct = %s"
CREDIT = "UPDATE ledger SET balance = balance + %s WHERE acct = %s"
TRANSFER, AUDIT = "clinic.ledger.transfer", "clinic.ledger.audit"


def read_skew(root: Path = REPO) -> IncidentEvent:
    """The audit sees a = 50 (before the transfer of 10) and b = 60 (after it): 110, and fails."""
    r = Recorder(keys={"ledger": ["acct"]})
    file = root / "tests" / "repair" / "clinic" / "ledger.py"
    t = r.trace("c", TRANSFER, file)
    u = r.trace("d", AUDIT, file, failed="clinic.ledger.BooksDoNotBalance")
    r.statement(u, 0, READ_BALANCE, ("a",))
    wa = r.statement(t, 5, DEBIT, (10, "a"))
    wb = r.statement(t, 6, CREDIT, (10, "b"))
    r.statement(u, 40, READ_BALANCE, ("b",))
    r.close(t, u)
    r.commit(wa, "ledger", {"acct": "a"}, {"acct": "a", "balance": 50}, {"acct": "a", "balance": 40}, 20, tx="9")
    r.commit(wb, "ledger", {"acct": "b"}, {"acct": "b", "balance": 50}, {"acct": "b", "balance": 60}, 20, tx="9")
    [incident] = r.incidents()
    return incident


# ---- invariant violation without an invariant: the shop's oversell, with the default configuration -------------
READ_STOCK = "SELECT stock FROM inventory WHERE sku = %s"
TAKE_UNIT = "UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock"
CHECKOUT = "shop.handlers.checkout"


def oversell(root: Path = REPO, sku: str = "sku-1") -> IncidentEvent:
    """Two checkouts of the last unit: both read 1, both decrement; the second fails in allocation (Oversold)."""
    r = Recorder(keys={"inventory": ["sku"]})
    file = root / "bench" / "shop" / "handlers.py"
    a = r.trace("g", CHECKOUT, file)
    b = r.trace("h", CHECKOUT, file, failed="bench.shop.errors.Oversold")
    r.statement(a, 0, READ_STOCK, (sku,))
    r.statement(b, 1, READ_STOCK, (sku,))
    wa = r.statement(a, 3, TAKE_UNIT, (sku,))
    wb = r.statement(b, 4, TAKE_UNIT, (sku,))
    r.close(a, b)
    r.commit(wa, "inventory", {"sku": sku}, {"sku": sku, "stock": 1}, {"sku": sku, "stock": 0}, 10)
    r.commit(wb, "inventory", {"sku": sku}, {"sku": sku, "stock": 0}, {"sku": sku, "stock": -1}, 11)
    [incident] = r.incidents()
    return incident


CASES = {"write_skew": write_skew, "phantom": phantom, "double_booking": double_booking, "read_skew": read_skew,
         "invariant_violation": oversell}  # fmt: skip
