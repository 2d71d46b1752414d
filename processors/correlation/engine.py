"""Correlate a committed Debezium ``RowChange`` with the span ``Access`` that made it.

Evidence, strongest first: a trace id written into the row; the transaction id recorded on the span; the
same row with the statement's bound values and a commit time inside the request (after the statement ended,
before the request did, within the tolerated clock skew). The entities stage asks only once every trace that could
have written the change is known (its event time has passed the commit time plus ``max_commit_delay_ms``), and
asks for all of one row's waiting changes at once (:meth:`RowCorrelator.correlate_many`): an access makes at most
one change, and when k changes of one row each match the same k writers equally well on values and time, the commit
order decides (the writer whose statement ended first committed first: a second UPDATE of a row waits for the
first one's lock until that one commits; across rows, the one assignment a single clock offset allows:
``processors.correlation.clock_match``). Anything else that is ambiguous is not guessed: the change stays
uncorrelated and the ambiguity is counted.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from processors.api.telemetry import Telemetry
from processors.correlation.clock_match import one_assignment
from processors.correlation.ties import ChangeId, MadeAnother, change_id, components, unmade
from processors.correlation.write_history import WriteHistory
from processors.model.events import (
    Access,
    CdcOp,
    DbOperation,
    LockMode,
    RowChange,
    change_followed,
    entity_key,
    scope_key,
)
from processors.model.units import MS_NS
from processors.sql import identity_entity_key, normalise_key_value
from processors.sql.values import covers, same_value
from processors.state.lru import CountedLRU

_HEX: Final = frozenset("0123456789abcdef")
_MAX_IDENTITY_SETS: Final = 8


@dataclass(frozen=True, slots=True)
class Correlation:
    """Which Access made a row change, and how sure we are."""

    access: Access
    strength: str  # "trace_column" | "tx_id" | "values_time" | "commit_order" | "tx_order" | "tied"
    skew_ms: float  # distance of the commit outside [statement end, request end]; 0 for id matches
    detail: str
    among: tuple[RowChange, ...] = ()  # "tied": the access made one of these changes, which one is not known


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


def _one_row(a: Access) -> bool:
    """Whether the access can make one change only (a predicate UPDATE or DELETE may change many rows; one naming
    its row by a key whose values were not on the span changes one)."""
    return a.keyed or a.unbound_key or a.operation is DbOperation.INSERT


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
        *,
        history_per_table: int = 4096,
        max_bytes: int | None = None,
        clock_jitter_ms: float = 1.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.trace_column = trace_column
        self.skew_ms, self.clock_jitter_ms = skew_ms, clock_jitter_ms
        self.max_commit_delay_ms = max_commit_delay_ms
        self._per_entity = max(1, history_per_entity)
        self._per_table = max(1, history_per_table)
        self.telemetry = (telemetry or Telemetry("correlation")).declare("history_per_entity", "history_per_table")
        self._history: CountedLRU[str, WriteHistory] = CountedLRU(max(1, max_entities), self.telemetry, "max_entities")
        # The approximate size of every history, against ``max_bytes`` (least recently written rows go first).
        self.max_bytes = max_bytes
        self.bytes = 0
        if max_bytes is not None:
            self.telemetry.declare("max_history_bytes")
        self._identity: dict[str, list[tuple[str, ...]]] = {}  # table → identity column sets seen
        self.last_reason = ""  # why the last correlate() returned what it did
        self._timed: list[tuple[Access, float, int]] = []  # the last correlate()'s values-and-time matches
        self.unresolved: list[RowChange] = []  # the last correlate_many()'s changes left tied among their writers
        # For each of those (by id), the latest commit time (ns, skew included) any of its tied writers could have
        # made a change at: until then another change of its row that commit order needs may still come.
        self.unresolved_until: dict[int, int] = {}
        # Accesses that made a change already (an access makes one change per row) and which change, bounded like the
        # histories: a change credited again (a replay after a restart or a rebalance) gets the same writer.
        self._credited: CountedLRU[tuple[str, str], ChangeId] = CountedLRU(max(1, max_entities) * 4, self.telemetry,
                                                                           "credited_memory")  # fmt: skip
        # Tables Debezium has sent a change of: only their rows' writes can wait for one (``prune``).
        self._captured: CountedLRU[str, None] = CountedLRU(max(1, max_entities), self.telemetry, "max_entities")

    @property
    def counters(self) -> dict[str, int]:
        """Outcomes and reasons counted so far (drops are in ``telemetry.dropped``)."""
        return self.telemetry.events

    def _count(self, key: str) -> None:
        self.telemetry.count(key)

    def add_access(self, a: Access) -> None:
        """Remember a write Access (reads and failed statements cannot produce row changes)."""
        if a.operation is DbOperation.READ or a.error:
            self._count("ignored_reads" if a.operation is DbOperation.READ else "ignored_errors")
            return
        history = self._history.get(a.entity)
        if history is None:
            history = WriteHistory(self._per_entity if a.keyed else self._per_table)
            for _, gone in self._history.put(a.entity, history):  # max_entities: the least recently written row
                self.bytes -= gone.bytes
        elif (a.trace_id, a.span_id) in history.spans:
            self._count("duplicate_accesses")  # redelivered span, or `IN (1, 1)`
            return
        if len(history) == history.maxlen:
            self.telemetry.drop("history_per_entity" if a.keyed else "history_per_table")
        before = history.bytes
        history.append(a)
        self.bytes += history.bytes - before
        if self.max_bytes is not None and self.bytes > self.max_bytes:
            self._shed(a.entity)
        cols = _identity_columns(a.entity) if a.operation is DbOperation.INSERT else ()
        if cols:
            known = self._identity.setdefault(a.table, [])
            if cols not in known and len(known) < _MAX_IDENTITY_SETS:
                known.append(cols)

    def _shed(self, entity: str) -> None:
        """Over ``max_bytes``: forget the least recently written rows' histories (the row just written, ``entity``,
        goes last: alone over the bound, it keeps only its newest write), counting every write forgotten."""
        assert self.max_bytes is not None
        while self.bytes > self.max_bytes and (oldest := self._history.oldest()) is not None:
            key, history = oldest
            if key != entity:
                self._history.pop(key)
                self.bytes -= history.bytes
                self.telemetry.drop("max_history_bytes", len(history))
                continue
            if len(history) <= 1:
                break
            before = history.bytes
            history.popleft()  # as at history_per_entity
            self.bytes -= before - history.bytes
            self.telemetry.drop("max_history_bytes")

    def _entities(self, change: RowChange) -> list[str]:
        """The keys under which the writes that could have made ``change`` are remembered (its table's scope last)."""
        table = change.table.rsplit(".", 1)[-1]
        entities = [entity_key(table, tuple(normalise_key_value(v) for _, v in change.key))]
        if change.op is CdcOp.CREATE and change.after:
            after = change.after
            entities += [
                identity_entity_key(table, cols, [after[c] for c in cols])
                for cols in self._identity.get(table, ())
                if all(c in after for c in cols)
            ]
        return [*entities, scope_key(table)]

    def _candidates(self, change: RowChange) -> list[Access]:
        table = change.table.rsplit(".", 1)[-1]
        entities = self._entities(change)[:-1]
        keyed = [a for e in entities for a in self._history.peek(e) or () if _op_fits(change.op, a)]
        before = change.before if change.op is not CdcOp.CREATE else None
        scoped = [
            a
            for a in self._history.peek(scope_key(table)) or ()
            if _op_fits(change.op, a)
            and (
                a.operation is DbOperation.INSERT
                or before is None
                or covers(a.predicates, a.exact, before, a.where) is not False
            )
        ]
        return keyed + scoped

    def correlate_many(self, changes: Sequence[RowChange]) -> list[tuple[RowChange, Correlation | None]]:
        """The writers of one row's changes, in commit order, each access crediting at most one change. A change
        delivered more than once (a replay after a crash, before the first copy was credited) is matched once and
        every copy gets that writer: copies must not count as more changes than writers."""
        ordered = sorted(changes, key=lambda c: c.lsn)
        for c in ordered:  # the writes these changes followed are no longer waiting for one (see ``prune``)
            self._captured.add(c.table.rsplit(".", 1)[-1])
            for e in self._entities(c):
                if (history := self._history.peek(e)) is not None:
                    history.changed_ns = max(history.changed_ns, c.commit_ts_ms * MS_NS)
        first: dict[ChangeId, RowChange] = {}
        for c in ordered:
            first.setdefault(change_id(c), c)
        if len(first) < len(ordered):
            once = {change_id(c): f for c, f in self.correlate_many(list(first.values()))}
            return [(c, once[change_id(c)]) for c in ordered]
        results: list[Correlation | None] = []
        tied: list[tuple[int, list[Access]]] = []  # changes that matched several writers equally well
        for change in ordered:
            found = self.correlate(change, exclude=MadeAnother(self._credited, change))
            if found is not None and _one_row(found.access):
                self._credited.put((found.access.trace_id, found.access.span_id), change_id(change))
            elif self.last_reason == "ambiguous_values_time":
                tied.append((len(results), [a for a, _, _ in self._timed]))
            results.append(found)
        for component in components(tied):
            self._by_commit_order(component, ordered, results)
        self.unresolved = [ordered[i] for i, _ in tied if results[i] is None]  # tied with writers none settled
        self.unresolved_until = {id(ordered[i]): max(map(self._upper, cands)) + int(self.skew_ms * MS_NS)
                                 for i, cands in tied if results[i] is None}  # fmt: skip
        return list(zip(ordered, results, strict=True))

    def _by_commit_order(self, tied: list[tuple[int, list[Access]]], changes: list[RowChange],
                         results: list[Correlation | None]) -> None:  # fmt: skip
        """k tied changes over exactly k writers: the writer whose statement ended first made the first commit."""
        tied = [(i, unmade(cands, MadeAnother(self._credited, changes[i]))) for i, cands in tied]
        writers = {(a.trace_id, a.span_id): a for _, cands in tied for a in cands}
        rows = {changes[i].entity_key for i, _ in tied}
        one_tx = len({changes[i].tx_id for i, _ in tied}) == 1 and bool(changes[tied[0][0]].tx_id)
        ordered = sorted(writers.values(), key=lambda a: (a.end_ns, a.span_id))
        clocked = None if len(rows) == 1 or one_tx or not all(map(_one_row, writers.values())) else one_assignment(
            [changes[i] for i, _ in tied], [c for _, c in tied], self._upper, int(self.skew_ms * MS_NS),
            int(self.clock_jitter_ms * MS_NS))  # fmt: skip
        if (
            clocked is not None
        ):  # several rows: the one assignment one clock offset allows (processors.correlation.clock_match)
            ordered = clocked
        elif len(writers) != len(tied) or not all(ordered[k] in cands for k, (_, cands) in enumerate(tied)):
            return
        for k, (i, _) in enumerate(tied):
            a = ordered[k]
            skew = self._skew(a, changes[i].commit_ts_ms) or 0.0
            if clocked is not None:
                found = Correlation(a, "commit_order", skew, f"{len(tied)} changes of {len(rows)} rows tied on "
                                    f"values and time: the one assignment one clock offset allows")  # fmt: skip
            elif len(rows) == 1:  # one row: the second writer waited for the first one's lock
                found = Correlation(a, "commit_order", skew, f"{len(tied)} changes and writers tied on values and "
                                    f"time: matched in commit order")  # fmt: skip
            elif one_tx and len({w.trace_id for w in ordered}) == 1:  # one transaction's statements, in its order
                found = Correlation(a, "tx_order", skew, f"{len(tied)} changes of transaction {changes[i].tx_id} "
                                    f"and its {len(tied)} statements: matched in execution order")  # fmt: skip
            else:  # new rows: each of the k writers made one of them, which one is not known
                found = Correlation(a, "tied", skew, f"one of {len(tied)} rows these {len(tied)} writers wrote, "
                                    f"tied on values and time (listed in commit order)",
                                    tuple(changes[j] for j, cands in tied if a in cands))  # fmt: skip
            results[i] = self._found(found)
            if _one_row(a):
                self._credited.put((a.trace_id, a.span_id), change_id(changes[i]))

    def correlate(self, change: RowChange, exclude: Container[tuple[str, str]] = ()) -> Correlation | None:
        """The Access that made ``change``, or None (reason in ``last_reason`` and ``counters``); accesses in
        ``exclude`` ((trace id, span id)) already made another change."""
        self._timed = []
        if change.op not in (CdcOp.CREATE, CdcOp.UPDATE, CdcOp.DELETE):
            return self._none("unsupported_op")
        candidates = [a for a in self._candidates(change) if (a.trace_id, a.span_id) not in exclude]
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

        timed = self._timed = []
        for a in candidates:
            compared = _values_match(a, image)
            skew = self._skew(a, change.commit_ts_ms)
            if compared is not None and skew is not None:
                timed.append((a, skew, compared))
        if len(timed) > 1:
            return self._none("ambiguous_values_time")
        if not timed:
            return self._none("unmatched")
        a, skew, compared = timed[0]
        detail = f"{compared} value(s) equal" if compared else "time only (no comparable bound values)"
        return self._found(Correlation(a, "values_time", skew, f"{detail}; commit skew {skew:.3f} ms"))

    def _skew(self, a: Access, commit_ts_ms: int) -> float | None:
        """ms outside [statement end, request end] (0 inside), or None beyond the tolerance; without a known
        request, the commit may follow the statement by ``max_commit_delay_ms``."""
        lo = commit_ts_ms * 1_000_000
        hi = lo + 999_999  # source.ts_ms is truncated to the millisecond
        outside = max(0, a.end_ns - hi, lo - self._upper(a)) / 1e6
        return outside if outside <= self.skew_ms else None

    def _upper(self, a: Access) -> int:
        """The end of ``a``'s request (ns), or without one the latest its commit may follow its statement."""
        return max(a.request_end_ns, a.end_ns) if a.request_end_ns else a.end_ns + int(self.max_commit_delay_ms * 1e6)

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

    def prune(self, before_ns: int, waiting_before_ns: int | None = None) -> int:
        """Forget the writes that ended before ``before_ns`` (no change waiting to be credited can be theirs any
        more), oldest rows first, and the rows left with none; returns how many writes went. With
        ``waiting_before_ns`` (Debezium's lag bound), a write that no change of its row (of its table, for a
        predicate write) has followed yet (``change_followed``) is kept until then instead, for its change to be
        credited when it comes. Only the rows of a table Debezium has sent a change of wait; a table's scope waits in
        any case (its first change may be the late one)."""
        floor = before_ns if waiting_before_ns is None else min(before_ns, waiting_before_ns)
        skew_ns = int(self.skew_ms * MS_NS)
        gone = looked = 0
        while (oldest := self._history.oldest()) is not None and looked < len(self._history):
            entity, history = oldest
            table, _, key = entity.partition(":")
            cut = floor if key == "*" or table in self._captured else before_ns  # how old a waiting write may be
            held = history.bytes
            while (
                history
                and (end := max(history[0].end_ns, history[0].request_end_ns)) < before_ns
                and (end < cut or change_followed(history[0].end_ns, history.changed_ns, skew_ns))
            ):
                a = history.popleft()
                self._credited.pop((a.trace_id, a.span_id))
                gone += 1
            self.bytes -= held - history.bytes
            if not history:
                self._history.pop(entity)
                continue
            if max(history[0].end_ns, history[0].request_end_ns) >= before_ns:
                break  # the least recently used row still has recent writes: the others are newer
            self._history.get(entity)  # its oldest write waits for its change: to the back, and on to the next row
            looked += 1
        if gone:
            self._count("pruned")
        return gone

    def __len__(self) -> int:
        """Number of entities with remembered writes (their approximate size is ``bytes``)."""
        return len(self._history)
