"""The collision detector: independent traces that touched the same row inside the causal window.

Stage 2 feeds it, per entity, the accesses of closed traces (reads and writes with their lock modes) and the
committed row changes correlated with them. When the watermark is past an entity's last access plus the causal
window (and the time row changes need to arrive), the entity's history is judged, pair by pair of independent
traces (neither is an ancestor of the other: different traces, no span link between them):

``lost_update`` (Adya P4)
    Both traces read the row without a lock and then write it without a guard, each read before the other's
    write: both decided on the same version. Manifest when a trace failed or the first write's value is gone.
``invariant_violation``
    The same read-check-write race, and a committed after-image breaks a configured invariant (oversell).
``duplicate_apply``
    Two unguarded INSERTs of the same logical row (same identity, e.g. one charge per order). Manifest when both
    were applied.
``write_skew`` (G2-item)
    Each trace read two rows without locks and wrote a different one of them; checked across the rows this
    detector instance holds.

The *culprit* is the first conflicting write; the *victim* is the trace that failed, or the one that acted on the
stale read. "The victim is never the culprit." Every writer of the entity in the window is reported.
"""

from __future__ import annotations

import hashlib
import heapq
from collections import OrderedDict, deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from processors.invariants import Invariant
from streamer.events import Access, DbOperation, LockMode, RowChange

UNGUARDED = LockMode.NONE
LOCKED_READS = (LockMode.FOR_UPDATE, LockMode.FOR_SHARE)
WRITES = (DbOperation.WRITE, DbOperation.INSERT, DbOperation.DELETE)


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed row change, with the trace and span that made it when correlation found them."""

    change: RowChange
    trace_id: str = ""
    span_id: str = ""
    strength: str = "none"
    skew_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Collision:
    anomaly: str
    manifest: bool
    entity: str
    table: str
    culprit: Access
    victim: Access
    writers: tuple[Access, ...]
    accesses: tuple[Access, ...]
    commits: tuple[Commit, ...]
    damage: str
    confidence: float
    evidence: tuple[str, ...]
    fingerprint: str
    occurrence: str

    @property
    def window_ms(self) -> float:
        times = [a.start_ns for a in self.accesses] + [a.end_ns for a in self.accesses]
        return (max(times) - min(times)) / 1e6


@dataclass(slots=True)
class _Entity:
    accesses: deque[Access]
    commits: deque[Commit]
    last_ns: int = 0
    scheduled: bool = False  # a judgement deadline is queued
    sources: list[Hashable] = field(default_factory=list)  # input positions to release once judged


@dataclass(frozen=True, slots=True)
class Judgement:
    """What one ``close_until`` decided: the collisions found, and the input that is no longer needed."""

    collisions: list[Collision]
    released: list[Hashable]


def fingerprint(anomaly: str, table: str, accesses: Sequence[Access]) -> str:
    """Same defect, same fingerprint: the anomaly, the table, and the code and statements involved.

    Row keys, trace ids, parameters and times are left out, so every occurrence of one defect shares it,
    whichever of the two code paths happened to write first.
    """
    sites = sorted({f"{a.service}|{a.function}|{a.operation.value}|{a.statement}" for a in accesses})
    digest = hashlib.sha256("\n".join([anomaly, table, *sites]).encode()).hexdigest()
    return digest[:16]


def _occurrence(fp: str, entity: str, culprit: Access, victim: Access) -> str:
    return hashlib.sha256(f"{fp}|{entity}|{culprit.trace_id}|{victim.trace_id}".encode()).hexdigest()[:16]


def _independent(a: Sequence[Access], b: Sequence[Access]) -> bool:
    ta, tb = a[0].trace_id, b[0].trace_id
    return ta != tb and tb not in a[0].links and ta not in b[0].links


def _rmw(accesses: Sequence[Access]) -> tuple[Access, Access] | None:
    """An unlocked read followed by an unguarded write in one trace: (read, write), or None."""
    read: Access | None = None
    for a in accesses:
        if a.operation == DbOperation.READ and a.lock == UNGUARDED and read is None:
            read = a
        elif a.operation == DbOperation.WRITE and a.lock == UNGUARDED and read is not None:
            return read, a
    return None


def _locked(accesses: Sequence[Access]) -> bool:
    return any(a.lock != UNGUARDED for a in accesses)


class CollisionDetector:
    """Per-entity bounded histories judged on the watermark; see the module docstring."""

    def __init__(
        self,
        *,
        window_ns: int,
        settle_ns: int,
        invariants: Mapping[str, list[Invariant]] | None = None,
        history_per_entity: int = 256,
        max_entities: int = 100_000,
        max_traces: int = 200_000,
    ) -> None:
        self.window_ns = window_ns
        self.settle_ns = settle_ns
        self.invariants = dict(invariants or {})
        self.history = history_per_entity
        self.max_entities = max_entities
        self.max_traces = max_traces
        self._entities: OrderedDict[str, _Entity] = OrderedDict()
        self._deadlines: list[tuple[int, str]] = []
        self._by_trace: OrderedDict[str, list[Access]] = OrderedDict()  # for cross-row write skew
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._evicted_sources: list[Hashable] = []
        self.counters = {"accesses": 0, "commits": 0, "entity_evictions": 0, "history_drops": 0, "judged": 0}

    def __len__(self) -> int:
        return len(self._entities)

    def _entity(self, key: str) -> _Entity:
        state = self._entities.get(key)
        if state is None:
            if len(self._entities) >= self.max_entities:
                _, evicted = self._entities.popitem(last=False)
                self._evicted_sources += evicted.sources
                self.counters["entity_evictions"] += 1
            state = self._entities[key] = _Entity(deque(maxlen=self.history), deque(maxlen=self.history))
        else:
            self._entities.move_to_end(key)
        return state

    def on_access(self, access: Access, source: Hashable | None = None) -> None:
        """Add an access; ``source`` (its input position) is handed back in ``released`` once judged."""
        state = self._entity(access.entity)
        if source is not None:
            state.sources.append(source)
        if access.error and access.operation in WRITES:
            return  # a statement that failed wrote nothing
        if len(state.accesses) == state.accesses.maxlen:
            self.counters["history_drops"] += 1
        state.accesses.append(access)
        self.counters["accesses"] += 1
        self._touch(access.entity, state, access.end_ns)
        trace = self._by_trace.setdefault(access.trace_id, [])
        trace.append(access)
        if len(self._by_trace) > self.max_traces:
            self._by_trace.popitem(last=False)

    def on_commit(self, entity: str, commit: Commit, source: Hashable | None = None) -> None:
        state = self._entity(entity)
        state.commits.append(commit)
        if source is not None:
            state.sources.append(source)
        self.counters["commits"] += 1
        self._touch(entity, state, commit.change.commit_ts_ms * 1_000_000)

    def _touch(self, key: str, state: _Entity, event_ns: int) -> None:
        """Queue a judgement after the newest event; also after an old one, if the entity was judged already."""
        if event_ns > state.last_ns or not state.scheduled:
            state.last_ns = max(state.last_ns, event_ns)
            state.scheduled = True
            heapq.heappush(self._deadlines, (state.last_ns + self.window_ns + self.settle_ns, key))

    def close_until(self, watermark_ns: int) -> Judgement:
        """Judge every entity whose deadline the watermark has passed; prune what can no longer collide."""
        found: list[Collision] = []
        released, self._evicted_sources = self._evicted_sources, []
        while self._deadlines and self._deadlines[0][0] <= watermark_ns:
            deadline, key = heapq.heappop(self._deadlines)
            state = self._entities.get(key)
            if state is None or state.last_ns + self.window_ns + self.settle_ns != deadline:
                continue
            self.counters["judged"] += 1
            state.scheduled = False
            found += self._judge(key, state)
            released += state.sources
            state.sources = []
            horizon = watermark_ns - 2 * self.window_ns
            while state.accesses and state.accesses[0].end_ns < horizon:
                state.accesses.popleft()
            while state.commits and state.commits[0].change.commit_ts_ms * 1_000_000 < horizon:
                state.commits.popleft()
        return Judgement(found, released)

    # ---- judging ------------------------------------------------------------------------------------------------

    def _judge(self, key: str, state: _Entity) -> list[Collision]:
        by_trace: dict[str, list[Access]] = {}
        for a in sorted(state.accesses, key=lambda a: (a.start_ns, a.span_id)):
            by_trace.setdefault(a.trace_id, []).append(a)
        if len(by_trace) < 2:
            return []
        traces = list(by_trace.values())
        out = []
        for i, first in enumerate(traces):
            for second in traces[i + 1 :]:
                if not _independent(first, second):
                    continue
                collision = self._pair(key, state, first, second)
                if collision is not None and collision.occurrence not in self._reported:
                    self._reported[collision.occurrence] = None
                    if len(self._reported) > 100_000:
                        self._reported.popitem(last=False)
                    out.append(collision)
        return out

    def _pair(self, key: str, state: _Entity, a: list[Access], b: list[Access]) -> Collision | None:
        ra, rb = _rmw(a), _rmw(b)
        interleaved = ra and rb and ra[0].start_ns < rb[1].start_ns and rb[0].start_ns < ra[1].start_ns
        if ra and rb and interleaved and abs(ra[1].start_ns - rb[1].start_ns) <= self.window_ns:
            return self._race(key, state, a, b, ra, rb)
        ia = [x for x in a if x.operation == DbOperation.INSERT and x.lock == UNGUARDED]
        ib = [x for x in b if x.operation == DbOperation.INSERT and x.lock == UNGUARDED]
        if ia and ib and abs(ia[0].start_ns - ib[0].start_ns) <= self.window_ns:
            return self._duplicate(key, state, a, b, ia[0], ib[0])
        return self._write_skew(key, state, a, b)

    def _writers(self, state: _Entity, culprit: Access, victim: Access) -> tuple[Access, ...]:
        lo = min(culprit.start_ns, victim.start_ns) - self.window_ns
        hi = max(culprit.end_ns, victim.end_ns) + self.window_ns
        return tuple(x for x in state.accesses if x.operation in WRITES and lo <= x.start_ns <= hi)

    def _commits_of(self, state: _Entity, *traces: str) -> list[Commit]:
        return sorted((c for c in state.commits if c.trace_id in traces), key=lambda c: c.change.lsn)

    def _race(self, key: str, state: _Entity, a: list[Access], b: list[Access],
              ra: tuple[Access, Access], rb: tuple[Access, Access]) -> Collision:  # fmt: skip
        first, second = (ra, rb) if ra[1].start_ns <= rb[1].start_ns else (rb, ra)
        culprit, victim = first[1], second[1]
        if culprit.trace_error and not victim.trace_error:
            culprit, victim = victim, culprit  # the request that failed is the victim, never the culprit
        table = culprit.table
        commits = self._commits_of(state, culprit.trace_id, victim.trace_id)
        evidence = [
            f"{x.function or x.service} read {key} without a lock at {_ms(x.start_ns, culprit.start_ns)} ms"
            for x in (first[0], second[0])
        ]
        evidence.append(f"first conflicting write by {culprit.function or culprit.service}: {culprit.statement}")
        anomaly, damage = "lost_update", ""
        broken = self._broken(table, state, culprit, victim)
        if broken:
            anomaly, damage = "invariant_violation", broken
        elif victim.trace_error:
            damage = f"victim failed: {victim.trace_exception or 'error'} (HTTP {victim.trace_status or '-'})"
        else:
            damage = self._lost_value(commits, culprit, victim)
        if victim.trace_error and broken:
            damage += f"; victim failed: {victim.trace_exception or 'error'}"
        evidence += [_commit_line(c) for c in commits]
        confidence = (
            0.6 + 0.2 * bool(commits) + 0.1 * bool(damage) + 0.1 * bool(culprit.read_version or victim.read_version)
        )
        return self._collision(anomaly, key, state, a, b, culprit, victim, commits, damage, confidence, evidence)

    def _broken(self, table: str, state: _Entity, culprit: Access, victim: Access) -> str:
        rules = self.invariants.get(table, [])
        if not rules:
            return ""
        lo = min(culprit.start_ns, victim.start_ns) // 1_000_000 - self.window_ns // 1_000_000
        for c in state.commits:
            if c.change.after is None or c.change.commit_ts_ms < lo:
                continue
            for rule in rules:
                if rule.holds(c.change.after) is False:
                    shown = ", ".join(f"{col} = {c.change.after.get(col)!r}" for col in rule.columns)
                    return f"committed {shown} violates {rule.text} (lsn {c.change.lsn})"
        return ""

    @staticmethod
    def _lost_value(commits: Sequence[Commit], culprit: Access, victim: Access) -> str:
        mine = [c for c in commits if c.trace_id == culprit.trace_id]
        theirs = [c for c in commits if c.trace_id == victim.trace_id]
        if not mine or not theirs or mine[0].change.lsn > theirs[-1].change.lsn:
            return ""
        first, last = mine[0].change.after or {}, theirs[-1].change.after or {}
        literal = {col for col, _ in victim.set_values if col not in victim.set_exprs}
        lost = {col: first.get(col) for col in literal if first.get(col) != last.get(col)}
        if not lost:
            return ""
        shown = ", ".join(f"{col} = {val!r} overwritten by {last.get(col)!r}" for col, val in sorted(lost.items()))
        return f"value lost: {shown}"

    def _duplicate(self, key: str, state: _Entity, a: list[Access], b: list[Access], xa: Access,
                   xb: Access) -> Collision:  # fmt: skip
        culprit, victim = (xa, xb) if xa.start_ns <= xb.start_ns else (xb, xa)
        created = [c for c in state.commits if c.change.op.value == "c"]
        applied = sum(1 for x in (culprit, victim) if not x.error)
        damage = ""
        if len(created) >= 2:
            damage = (
                f"{len(created)} rows committed for one {key} (lsn {', '.join(str(c.change.lsn) for c in created)})"
            )
        elif applied == 2 and not created:
            damage = f"both inserts for {key} succeeded"
        evidence = [
            f"{x.function or x.service} inserted {key} without a guard: {x.statement}" for x in (culprit, victim)
        ]
        evidence += [_commit_line(c) for c in created]
        confidence = 0.7 + 0.2 * (len(created) >= 2) + 0.1 * bool(culprit.idempotency_key or victim.idempotency_key)
        return self._collision(
            "duplicate_apply", key, state, a, b, culprit, victim, created, damage, confidence, evidence
        )

    def _write_skew(self, key: str, state: _Entity, a: list[Access], b: list[Access]) -> Collision | None:
        if _locked(a) or _locked(b):
            return None
        full_a = self._by_trace.get(a[0].trace_id, a)
        full_b = self._by_trace.get(b[0].trace_id, b)
        reads_a = {x.entity for x in full_a if x.operation == DbOperation.READ}
        reads_b = {x.entity for x in full_b if x.operation == DbOperation.READ}
        writes_a = [x for x in full_a if x.operation == DbOperation.WRITE and x.lock == UNGUARDED]
        writes_b = [x for x in full_b if x.operation == DbOperation.WRITE and x.lock == UNGUARDED]
        for wa in writes_a:
            for wb in writes_b:
                if wa.entity == wb.entity or wa.table != wb.table:
                    continue
                both = {wa.entity, wb.entity}
                if both <= reads_a and both <= reads_b and key in both:
                    first_read_b = min(x.start_ns for x in full_b if x.operation == DbOperation.READ)
                    first_read_a = min(x.start_ns for x in full_a if x.operation == DbOperation.READ)
                    if first_read_a < wb.start_ns and first_read_b < wa.start_ns:
                        culprit, victim = (wa, wb) if wa.start_ns <= wb.start_ns else (wb, wa)
                        evidence = [
                            f"{x.function or x.service} read {sorted(both)} and wrote {x.entity}" for x in (wa, wb)
                        ]
                        return self._collision("write_skew", key, state, full_a, full_b, culprit, victim, [],
                                               "", 0.7, evidence)  # fmt: skip
        return None

    def _collision(self, anomaly: str, key: str, state: _Entity, a: Sequence[Access], b: Sequence[Access],
                   culprit: Access, victim: Access, commits: Sequence[Commit], damage: str, confidence: float,
                   evidence: list[str]) -> Collision:  # fmt: skip
        involved = [x for x in (*a, *b) if x.operation in WRITES or x.operation == DbOperation.READ]
        conflicting = [x for x in involved if x.entity == key or anomaly == "write_skew"]
        fp = fingerprint(anomaly, culprit.table, conflicting)
        return Collision(
            anomaly=anomaly,
            manifest=bool(damage),
            entity=key,
            table=culprit.table,
            culprit=culprit,
            victim=victim,
            writers=self._writers(state, culprit, victim),
            accesses=tuple(sorted(involved, key=lambda x: x.start_ns)),
            commits=tuple(commits),
            damage=damage,
            confidence=round(min(confidence, 1.0), 2),
            evidence=tuple(evidence),
            fingerprint=fp,
            occurrence=_occurrence(fp, key, culprit, victim),
        )


def _ms(ns: int, origin_ns: int) -> str:
    return f"{(ns - origin_ns) / 1e6:+.1f}"


def _commit_line(c: Commit) -> str:
    who = f"trace {c.trace_id[:8]} ({c.strength})" if c.trace_id else "an uncorrelated writer"
    return f"lsn {c.change.lsn} tx {c.change.tx_id}: {_image(c.change.before)} -> {_image(c.change.after)} by {who}"


def _image(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "∅"
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(row.items())) + "}"


__all__ = ["Collision", "CollisionDetector", "Commit", "Judgement", "fingerprint"]
