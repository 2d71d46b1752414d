"""Correlate a committed Debezium ``RowChange`` with the span ``Access`` that made it.

Evidence, strongest first: a trace id written into the row; the transaction id recorded on the span; the
same row with the statement's bound values and a commit time inside the request. Ties at one strength are
not broken by guessing: the change stays uncorrelated and the ambiguity is counted.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from processors.sql_access import identity_entity_key, normalise_key_value
from streamer.events import Access, CdcOp, DbOperation, LockMode, RowChange, entity_key

_HEX: Final = frozenset("0123456789abcdef")
_TRUE: Final = frozenset({"t", "true", "y", "yes", "on", "1"})
_FALSE: Final = frozenset({"f", "false", "n", "no", "off", "0"})
_UNAVAILABLE: Final = "__debezium_unavailable_value"  # Debezium's placeholder for unchanged TOAST columns
_MAX_IDENTITY_SETS: Final = 8


@dataclass(frozen=True, slots=True)
class Correlation:
    """Which Access made a row change, and how sure we are."""

    access: Access
    strength: str  # "trace_column" | "tx_id" | "values_time"
    skew_ms: float  # distance of the commit outside [statement end, request end]; 0 for id matches
    detail: str


def _norm(value: Any) -> tuple[str, Any] | None:
    """(kind, value) with kind in null/bool/num/str; None when the value cannot be compared."""
    if value is None:
        return ("null", None)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | Decimal | float):
        d = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        return ("num", d) if d.is_finite() else ("str", str(value))
    if isinstance(value, str):
        if value == _UNAVAILABLE:
            return None
        try:
            d = Decimal(value.strip())
        except InvalidOperation:
            return ("str", value)
        return ("num", d) if d.is_finite() else ("str", value)
    return None


def _as_bool(kind: str, value: Any) -> bool | None:
    if kind == "bool":
        return bool(value)
    if kind == "num" and value in (0, 1):
        return bool(value)
    if kind == "str" and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def same_value(bound: Any, stored: Any) -> bool | None:
    """Whether a bound parameter equals a stored column value; None when they are not comparable."""
    a, b = _norm(bound), _norm(stored)
    if a is None or b is None:
        return None
    if a[0] == "null" or b[0] == "null":
        return a[0] == b[0]
    if "bool" in (a[0], b[0]):
        x, y = _as_bool(*a), _as_bool(*b)
        return None if x is None or y is None else x == y
    if a[0] == b[0]:
        return bool(a[1] == b[1])
    return None  # e.g. a timestamp string against Debezium's epoch number


def _values_match(access: Access, image: Mapping[str, Any]) -> int | None:
    """How many bound set_values the image confirms; None if one contradicts it."""
    compared = 0
    exprs = set(access.set_exprs)
    for column, value in access.set_values:
        if column in exprs or column not in image:
            continue
        same = same_value(value, image[column])
        if same is False:
            return None
        compared += same is True
    return compared


def _op_fits(op: CdcOp, access: Access) -> bool:
    if op is CdcOp.CREATE:
        return access.operation is DbOperation.INSERT
    if op is CdcOp.UPDATE:
        return access.operation is DbOperation.WRITE or (
            access.operation is DbOperation.INSERT and access.lock is LockMode.UPSERT
        )
    return op is CdcOp.DELETE and access.operation is DbOperation.DELETE


def _identity_columns(entity: str) -> tuple[str, ...]:
    """Columns of a ``table:col=v|col=v`` identity entity key; () for a plain key."""
    parts = entity.partition(":")[2].split("|")
    cols = tuple(p.partition("=")[0] for p in parts)
    return cols if all("=" in p for p in parts) and all(c.isidentifier() for c in cols) else ()


class RowCorrelator:
    """Bounded recent write Accesses per entity, and the matching of row changes against them."""

    def __init__(
        self,
        trace_column: str = "trace_id",
        skew_ms: float = 5.0,
        max_commit_delay_ms: float = 2000.0,
        history_per_entity: int = 64,
        max_entities: int = 100_000,
    ) -> None:
        self.trace_column = trace_column
        self.skew_ms = skew_ms
        self.max_commit_delay_ms = max_commit_delay_ms
        self._per_entity = max(1, history_per_entity)
        self._max_entities = max(1, max_entities)
        self._history: OrderedDict[str, deque[Access]] = OrderedDict()
        self._identity: dict[str, list[tuple[str, ...]]] = {}  # table → identity column sets seen
        self.counters: dict[str, int] = {}
        self.last_reason = ""  # why the last correlate() returned what it did

    def _count(self, key: str) -> None:
        self.counters[key] = self.counters.get(key, 0) + 1

    def add_access(self, a: Access) -> None:
        """Remember a write Access (reads and failed statements cannot produce row changes)."""
        if a.operation is DbOperation.READ or a.error:
            self._count("ignored_reads" if a.operation is DbOperation.READ else "ignored_errors")
            return
        history = self._history.get(a.entity)
        if history is None:
            history = self._history[a.entity] = deque(maxlen=self._per_entity)
            if len(self._history) > self._max_entities:
                self._history.popitem(last=False)
                self._count("entity_evictions")
        else:
            self._history.move_to_end(a.entity)
            if any(x.span_id == a.span_id and x.trace_id == a.trace_id for x in history):
                self._count("duplicate_accesses")  # redelivered span, or `IN (1, 1)`
                return
        if len(history) == self._per_entity:
            self._count("history_evictions")
        history.append(a)
        cols = _identity_columns(a.entity) if a.operation is DbOperation.INSERT else ()
        if cols:
            known = self._identity.setdefault(a.table, [])
            if cols not in known and len(known) < _MAX_IDENTITY_SETS:
                known.append(cols)

    def _candidates(self, change: RowChange) -> list[Access]:
        table = change.table.rsplit(".", 1)[-1]
        entities = [entity_key(table, tuple(normalise_key_value(v) for _, v in change.key))]
        if change.op is CdcOp.CREATE and change.after:
            after = change.after
            entities += [
                identity_entity_key(table, cols, [after[c] for c in cols])
                for cols in self._identity.get(table, ())
                if all(c in after for c in cols)
            ]
        return [a for e in entities for a in self._history.get(e, ()) if _op_fits(change.op, a)]

    def correlate(
        self, change: RowChange, request_intervals: Mapping[str, tuple[int, int]] | None = None
    ) -> Correlation | None:
        """The Access that made ``change``, or None (reason in ``last_reason`` and ``counters``)."""
        if change.op not in (CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE):
            return self._none("unsupported_op")
        candidates = self._candidates(change)
        if not candidates:
            return self._none("no_candidates")
        image = (change.before if change.op is CdcOp.DELETE else change.after) or {}

        tid = image.get(self.trace_column)
        tid = tid.lower() if isinstance(tid, str) else ""
        if len(tid) == 32 and set(tid) <= _HEX:
            before = change.before or {}
            if change.op is CdcOp.UPDATE and str(before.get(self.trace_column, "")).lower() == tid:
                self._count("trace_column_unchanged")  # may be a previous writer's id
            else:
                found = [a for a in candidates if a.trace_id == tid]
                if found:
                    return self._pick(found, "trace_column", image, f"{self.trace_column}={tid}")
                self._count("trace_column_unmatched")

        if change.tx_id:
            found = [a for a in candidates if a.tx_id == change.tx_id]
            if found:
                return self._pick(found, "tx_id", image, f"txId={change.tx_id}")

        timed: list[tuple[Access, float, int]] = []
        for a in candidates:
            compared = _values_match(a, image)
            skew = self._skew(a, change.commit_ts_ms, request_intervals)
            if compared is not None and skew is not None:
                timed.append((a, skew, compared))
        if len(timed) > 1:
            return self._none("ambiguous_values_time")
        if not timed:
            return self._none("unmatched")
        a, skew, compared = timed[0]
        detail = f"{compared} value(s) equal" if compared else "time only (no comparable bound values)"
        return self._found(Correlation(a, "values_time", skew, f"{detail}; commit skew {skew:.3f} ms"))

    def _skew(self, a: Access, commit_ts_ms: int, intervals: Mapping[str, tuple[int, int]] | None) -> float | None:
        """ms outside [statement end, request end] (0 inside), or None beyond the tolerance."""
        interval = intervals.get(a.trace_id) if intervals is not None else None
        upper = max(interval[1], a.end_ns) if interval else a.end_ns + int(self.max_commit_delay_ms * 1e6)
        lo = commit_ts_ms * 1_000_000
        hi = lo + 999_999  # source.ts_ms is truncated to the millisecond
        outside = max(0, a.end_ns - hi, lo - upper) / 1e6
        return outside if outside <= self.skew_ms else None

    def _pick(self, found: list[Access], strength: str, image: Mapping[str, Any], detail: str) -> Correlation | None:
        if len(found) > 1:
            narrowed = [a for a in found if _values_match(a, image)]  # at least one equal value, none unequal
            if len(narrowed) != 1:
                return self._none(f"ambiguous_{strength}")
            self._count("narrowed_by_values")
            found, detail = narrowed, f"{detail}; {len(found)} candidates narrowed by values"
        return self._found(Correlation(found[0], strength, 0.0, detail))

    def _found(self, c: Correlation) -> Correlation:
        self.last_reason = "matched_" + c.strength
        self._count(self.last_reason)
        return c

    def _none(self, reason: str) -> Correlation | None:
        self.last_reason = reason
        self._count(reason)
        return None

    def __len__(self) -> int:
        """Number of entities with remembered writes."""
        return len(self._history)
