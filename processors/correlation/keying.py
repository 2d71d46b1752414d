"""Keys for the accesses whose key values were not on their span (stage 2).

Stock instrumentation records no statement parameters (psycopg/psycopg2/dbapi ``capture_parameters=False``, the
SQLAlchemy instrumentation, the Java agent's sanitised literals), so a statement such as ``UPDATE accounts SET
balance = %s WHERE id = %s`` reaches stage 2 as a *predicate access* of ``accounts:*`` that names one row by its key
(``Access.unbound_key``) without saying which. Debezium says which row changed; so:

* a **write** credited with a row change (``processors.correlation.engine``: transaction id, else values and time, else
  commit order) takes that row as its key: ``by_change``, with the credit's confidence;
* a **read** of the same trace that came before it, on the same table, is keyed by what that write proves
  (``by_trace``), when the trace made no other write of that shape (else which one it guarded is not known): a read
  naming its row by the key the write filtered on (the check that guarded the write) reads that row; a predicate read
  whose missing values are all equalities on columns the write filtered on or inserted (``SELECT ... WHERE room = %s
  AND day = %s`` before ``INSERT ... (room, day, ...)``) gets those values from the row image;
* anything else stays a predicate access of the table, whose undecidable terms make it *may match* (the collision
  judge says so), never "no match".

Ambiguity is explicit: a change credited to one of k writers (``tied``) keys no write (counted ``ambiguous``), since
that would show one guessed row as fact; a read is then bound only by the values all k rows agree on, and records k.
State: the recent traces' unkeyed statements, bounded (``max_traces``, ``per_trace``), counted, pruned by event time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Final

from processors.api.telemetry import Telemetry
from processors.correlation.engine import Correlation
from processors.model.events import Access, CdcOp, DbOperation, Keying, RowChange, entity_key
from processors.sql import normalise_key_value
from processors.state.lru import CountedLRU

# How sure a key taken from a credited change is, by the credit's evidence (``processors.correlation.engine``).
CONFIDENCE: Final = {"trace_column": 1.0, "tx_id": 1.0, "tx_order": 0.9, "values_time": 0.8, "commit_order": 0.8}
_ABSENT: Final = object()
BY_TRACE: Final = 0.9  # a read keyed by the write it guarded: the same table, key and trace, but not the same statement


def inferred(a: Access) -> bool:
    """Whether the access's row was inferred (``by_change`` / ``by_trace``) rather than bound."""
    return a.keying in (Keying.BY_CHANGE, Keying.BY_TRACE)


def undecided(a: Access) -> bool:
    """A predicate access whose WHERE has terms without values (the span carried none): it *may* match a row."""
    return a.keying == Keying.PREDICATE and bool(a.unbound or a.unbound_key)


def keyable(a: Access) -> bool:
    """A write of one row that its span does not name: its key, or an inserted value, was not on the span."""
    one_row = a.unbound_key or a.operation is DbOperation.INSERT
    return a.keying == Keying.PREDICATE and one_row and (undecided(a) or len(a.set_values) < len(a.set_columns))


class KeyInference:
    """The recent traces' unkeyed statements, and the keys a credited row change proves for them."""

    def __init__(self, max_traces: int = 100_000, per_trace: int = 256, telemetry: Telemetry | None = None) -> None:
        self.telemetry = (telemetry or Telemetry("keying")).declare("max_traces", "per_trace")
        self._per_trace = max(1, per_trace)
        self._traces: CountedLRU[str, list[Access]] = CountedLRU(max(1, max_traces), self.telemetry, "max_traces")
        self._keyed: CountedLRU[tuple[str, str], str] = CountedLRU(max(1, max_traces) * 4, self.telemetry,
                                                                   "max_traces")  # fmt: skip

    def add(self, a: Access) -> None:
        """Remember a statement whose key or predicate values were not on its span (failed statements touch
        nothing)."""
        if not (undecided(a) or keyable(a)) or a.error:
            return
        mine = self._traces.get(a.trace_id)
        if mine is None:
            self._traces.put(a.trace_id, [a])
        elif all(x.span_id != a.span_id for x in mine):
            if len(mine) >= self._per_trace:
                self.telemetry.drop("per_trace")
                return
            mine.append(a)

    def __len__(self) -> int:
        """Traces with statements waiting for a key."""
        return len(self._traces)

    def prune(self, before_ns: int) -> int:
        """Forget the traces whose statements all ended before ``before_ns`` (no change still to be credited can be
        their writes'), oldest first; returns how many went."""
        gone = 0
        while (oldest := self._traces.oldest()) is not None and max(a.end_ns for a in oldest[1]) < before_ns:
            self._traces.pop(oldest[0])
            gone += 1
        return gone

    def credited(self, change: RowChange, credit: Correlation | None) -> list[Access]:
        """The accesses ``change`` keys now that it is credited: its writer (``by_change``) and the reads of the same
        trace before it that the writer proves (``by_trace``); [] when none is unkeyed."""
        if credit is None or not keyable(credit.access):
            return []
        write = credit.access
        if change.op not in (CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE):
            return []
        row = entity_key(change.table, tuple(normalise_key_value(v) for _, v in change.key))
        among = credit.among or (change,)
        out: list[Access] = []
        if len(among) > 1:  # one of k rows: no row is shown as fact; a read is bound only by what all k agree on
            self.telemetry.count("ambiguous")
            confidence = CONFIDENCE["commit_order"]  # (what all k rows agree on is proven as well as one row's)
        else:
            confidence = CONFIDENCE.get(credit.strength, 0.5)
            if self._keyed.peek((write.trace_id, write.span_id)) == row:
                return []  # a change delivered again: keyed already
            self._keyed.put((write.trace_id, write.span_id), row)
            self.telemetry.count(Keying.BY_CHANGE.value)
            out.append(replace(write, entity=row, keyed=True, keying=Keying.BY_CHANGE.value,
                               key_confidence=confidence))  # fmt: skip
        images = [(c.after if change.op is CdcOp.CREATE else c.before) or {} for c in among]
        mine = self._traces.peek(write.trace_id) or []
        alike = [w for w in mine if w.operation is write.operation and w.table == write.table and w.filters ==
                 write.filters and w.span_id != write.span_id]  # fmt: skip
        reads = [r for r in mine if r.operation is DbOperation.READ and r.table == write.table
                 and r.start_ns <= write.start_ns and (r.trace_id, r.span_id) not in self._keyed]  # fmt: skip
        if alike and reads:  # several writes of this shape in the trace: which one a read guarded is not known
            self.telemetry.count("ambiguous_reads", len(reads))
            return out
        for read in reads:  # (one keyed by an earlier write of the trace is left: the nearest write guards it)
            keyed = self._by_trace(read, write, change, row, images, round(confidence * BY_TRACE, 2))
            if keyed is not None:
                self._keyed.put((read.trace_id, read.span_id), keyed.entity)
                self.telemetry.count(Keying.BY_TRACE.value)
                out.append(keyed)
        return out

    @staticmethod
    def _by_trace(read: Access, write: Access, change: RowChange, row: str, images: list[dict[str, Any]],
                  confidence: float) -> Access | None:  # fmt: skip
        """``read`` keyed by what ``write`` (of the same trace, after it) proves, or None. ``images`` are the rows
        the write may have made (one, unless its credit is ambiguous): a value is proven when all agree on it."""
        proven = set(write.filters) | (set(write.set_columns) if write.operation is DbOperation.INSERT else set())
        key = [column for column, _ in change.key]
        if read.unbound_key:
            if len(images) == 1 and key and set(key) <= set(read.filters) and set(key) <= proven:
                return replace(read, entity=row, keyed=True, keying=Keying.BY_TRACE.value, key_confidence=confidence)
            return None
        missing = read.unbound
        if not missing or any(op != "=" or column not in proven for column, op in missing):
            return None
        values = []
        for column, _ in missing:
            seen = {repr(image.get(column, _ABSENT)) for image in images}
            if len(seen) != 1 or column not in images[0]:
                return None  # the candidate rows disagree on it: not proven
            values.append((column, "=", images[0][column]))
        # The terms are now its whole WHERE (``unbound`` is only kept of a WHERE read whole), bound: they are
        # evaluated instead of the compiled tree, whose placeholders the span left empty.
        return replace(read, predicates=read.predicates + tuple(values), exact=True, unbound=(), where=None,
                       keying=Keying.BY_TRACE.value, key_candidates=len(images), key_confidence=confidence)  # fmt: skip
