"""Classifying collisions: the dependencies between two independent traces, in Adya's terms.

Traces are independent when neither is an ancestor of the other (different traces, no span link). What each did
to a row comes from its keyed statements on the row, its *predicate* statements on the table (a WHERE naming no row
by key, an INSERT whose key the database assigns) that cover an image of the row, and the changes credited to it. A
statement whose values were not on its span is keyed by stage 2 where a row change proves its row
(``processors.correlation.keying``); else it *may* match a row its known terms allow (lower confidence, said in the
evidence), never "no match". Between two traces:

* **rw** (anti-dependency) A → B: A read a version of a row (by key, or a predicate that selects it) and B
  committed the next one after A's statement ended; for a predicate read, also when B's change makes the row
  enter or leave the predicate (a phantom). A read under ``FOR UPDATE``/``FOR SHARE`` waits and reads the newest
  version, so it gives no rw edge on an existing row (it still misses a row inserted meanwhile).
* **ww** B → A: both wrote the row; B's write came first (commit order, else statement order).
* **wr** B → A: A's statement started after B's commit and read the row B wrote.

Classes (Elle's vocabulary; Adya's phenomenon in parentheses), each only with the evidence it needs:

``lost_update`` (G-single: A →rw B →ww A on one row)
    Both read the row unlocked, each before the other's write, and the second writer *sets* a value (a column
    assigned a parameter or literal). A relative update (``x = x - 1``) reads the row under its lock and keeps the
    other's change: never a lost update. Manifest when a written value is gone from the committed image, or a
    writer failed.
``invariant_violation`` (G-single with its damage)
    The same stale-read race where a committed image breaks a configured invariant, or, for relative updates,
    where the victim failed. Without that evidence two relative updates are nothing.
``duplicate_apply``
    Two unguarded INSERTs of one configured identity (``sql.insert_identity``).
``write_skew`` (G2-item: A →rw B →rw A over two rows)
    Each read (by key or by predicate) a row the other then changed, and both committed.
``phantom`` (G2: the same cycle through inserts)
    Each read a predicate that matched no row (or fewer), and each inserted a row the other's predicate selects,
    and both committed: the predicate double insert.
``read_skew`` (G-single: A →rw B →wr A over two rows)
    A read row x before B's transaction committed and row y after it, B having written both: A saw half of it.
    Manifest when A failed.

The *culprit* is the first committed conflicting write; the *victim* is the trace that acted on what it read (the
one that failed, when one did), never the culprit. Multi-row classes are reported once per pair of traces.
"""

from __future__ import annotations

from collections.abc import Mapping

from processors.api.telemetry import Telemetry
from processors.detectors.collisions.two_rows import TwoRows
from processors.detectors.collisions.views import (
    UNGUARDED,
    WRITES,
    Collision,
    EntityHistory,
    Memory,
    View,
    absolute_columns,
    add_access,
    broken_invariant,
    collision_of,
    commit_line,
    failure_text,
    image_at,
    independent,
    lost_value,
    moves_row,
    ms_from,
    reads_row,
    write_order,
)
from processors.lib.invariants import Invariant
from processors.model.anomaly import Anomaly
from processors.model.events import Access, CdcOp, Commit, DbOperation, scope_key
from processors.model.units import MS_NS
from processors.sql.values import covers


class PairJudge:
    """Judges one row's history, pair by pair of independent traces; see the module docstring."""

    def __init__(self, window_ns: int, invariants: Mapping[str, list[Invariant]] | None = None,
                 skew_ns: int = 5 * MS_NS, telemetry: Telemetry | None = None) -> None:  # fmt: skip
        self.telemetry = telemetry or Telemetry("collisions")
        self.window_ns = window_ns
        self.skew_ns = skew_ns
        self.invariants = dict(invariants or {})
        self._row_writes: list[Access] = []  # the row being judged: its writes, by key or credited
        self.two_rows = TwoRows(window_ns, skew_ns, self._moves)  # write skew, phantom, read skew

    def _undecided(self, reason: str) -> None:  # a predicate an image could not decide: not taken to read the row
        self.telemetry.count(f"predicate_undecidable_{reason}")

    def _moves(self, read: Access, commit: Commit) -> bool | None:
        return moves_row(read, commit, self._undecided)

    # ---- the row's participants -----------------------------------------------------------------------------

    def views(self, key: str, state: EntityHistory, memory: Memory) -> dict[str, View]:
        """Every trace that read or wrote the row: by key, by a predicate that covers one of its images, or by a
        change credited to it."""
        commits = sorted(state.commits, key=lambda c: c.change.lsn)
        views: dict[str, View] = {}

        def view(trace: str) -> View:
            return views.setdefault(trace, View(trace))

        for a in state.accesses:
            add_access(view(a.trace_id), a)
        table = key.partition(":")[0]
        scope = memory.scope(scope_key(table))
        if scope is not None and commits:
            for p in scope.accesses:
                if p.operation is DbOperation.WRITE:
                    # An UPDATE whose WHERE selected the row's version when it started wrote that row, whether or
                    # not a change could be credited to it (two value-less ``stock = stock - 1`` match both).
                    if covers(p.predicates, p.exact, image_at(commits, p.start_ns), p.where, self._undecided) is True:
                        add_access(view(p.trace_id), p)
                    continue
                if p.operation is not DbOperation.READ:
                    continue  # a predicate insert or delete is known here by the change credited to it
                at = image_at(commits, p.start_ns)
                if at is not None and covers(p.predicates, p.exact, at, p.where, self._undecided) is True:
                    add_access(view(p.trace_id), p)  # it read the row's version through its predicate
                elif any(self._moves(p, c) is not False for c in commits if c.trace_id != p.trace_id) or (
                    reads_row(p, key, at) is None  # it may have read the row (its WHERE's values not on its span)
                ):
                    v = view(p.trace_id)
                    v.moved.append(p)
                    v.all.append(p)
        for c in commits:
            if not c.trace_id:
                continue
            v = view(c.trace_id)
            v.commits.append(c)
            made = next((a for a in memory.by_trace.peek(c.trace_id) or () if a.span_id == c.span_id), None)
            if made is not None and made not in v.writes:
                v.writes.append(made)
                if made not in v.all:
                    v.all.append(made)
        return views

    def judge(self, key: str, state: EntityHistory, memory: Memory, *, until_ns: int | None = None) -> list[Collision]:
        """The collisions on row ``key`` between traces whose statements there all ended by ``until_ns`` (their
        commits are credited), at least one of them not judged before (those are added to ``state.judged``)."""
        views = self.views(key, state, memory)
        self._row_writes = sorted({w for v in views.values() for w in v.writes if w.operation in WRITES},
                                  key=lambda w: (w.start_ns, w.span_id))  # fmt: skip
        ready = sorted(
            (v for v in views.values() if v.all or v.commits),
            key=lambda v: (min((a.start_ns for a in v.all), default=0), v.trace),
        )
        if until_ns is not None:
            ready = [v for v in ready if v.end_ns <= until_ns]
        out = []
        for i, first in enumerate(ready):
            for second in ready[i + 1 :]:
                if first.trace in state.judged and second.trace in state.judged:
                    continue  # this pair was judged before
                if not (first.writes or first.commits or second.writes or second.commits):
                    continue  # every class needs a writer of the row (readers alone: the may-match reads of a table)
                if not independent(first.trace, second.trace, memory):
                    continue
                found = (
                    self._same_row(key, state, first, second)
                    or self._duplicate(key, state, first, second)
                    or self.two_rows.cycle(key, first.trace, second.trace, memory)
                    or self.two_rows.read_skew(key, first.trace, second.trace, memory)
                )
                if found is not None:
                    out.append(found)
        state.judged.update(v.trace for v in ready)
        return out

    # ---- one row: lost update, invariant violation, duplicate apply ------------------------------------------

    def _same_row(self, key: str, state: EntityHistory, a: View, b: View) -> Collision | None:
        wa = [w for w in a.writes if w.operation is DbOperation.WRITE and not w.error]
        wb = [w for w in b.writes if w.operation is DbOperation.WRITE and not w.error]
        if not (a.reads and b.reads and wa and wb):
            return None
        if any(w.lock is not UNGUARDED for w in (*wa, *wb)) or a.locked or b.locked:
            return None  # a guarded write or a locked read: the database serialised them
        ra, rb = a.reads[0], b.reads[0]
        if not (ra.start_ns < wb[0].start_ns and rb.start_ns < wa[0].start_ns):
            return None  # one read after the other's write: it saw it (or waited for it)
        if abs(wa[0].start_ns - wb[0].start_ns) > self.window_ns:
            return None
        first, second = write_order(a, b, wa[0], wb[0])
        (fv, fw, fr), (sv, sw, sr) = first, second
        culprit, victim = fw, sw
        relative = bool(sw.set_exprs) and not absolute_columns(sw)  # (nothing known of what it set: not relative)
        correlated = bool(fv.commits and sv.commits)
        lo_ms = min(culprit.start_ns, victim.start_ns) // MS_NS - self.window_ns // MS_NS
        broken, invariant = broken_invariant(self.invariants.get(culprit.table, []), state.commits, lo_ms)
        failed = victim if victim.trace_error else culprit if culprit.trace_error else None
        if failed is culprit:
            culprit, victim = victim, culprit  # the request that failed is the victim, never the culprit
        evidence = [
            f"{x.function or x.service} read {key} without a lock at {ms_from(x.start_ns, fw.start_ns)} ms: "
            f"{x.statement}"
            for x in (fr, sr)
        ]
        evidence.append(f"first conflicting write by {fw.function or fw.service}: {fw.statement}")
        how = (
            f"relative to its current value ({', '.join(sw.set_exprs)}): no value of the first write is lost"
            if relative
            else f"setting {', '.join(absolute_columns(sw))} to what it computed from its stale read"
        )
        evidence.append(f"then {sw.function or sw.service} wrote it {how}")
        commits = sorted(fv.commits + sv.commits, key=lambda c: c.change.lsn)
        evidence += [commit_line(c) for c in commits]
        if not correlated:
            evidence.append("the row changes are not correlated with both traces: classified by the statements")
        if broken:
            anomaly, damage = Anomaly.INVARIANT_VIOLATION, broken
            if failed is not None:
                damage += f"; {failure_text(victim)}"
        elif relative:
            if failed is None:
                return None  # two relative updates after a stale read, and nothing broke: not an anomaly
            anomaly, damage = Anomaly.INVARIANT_VIOLATION, failure_text(victim)
            evidence.append("the check its read made no longer held when it wrote: it failed")
        else:
            anomaly = Anomaly.LOST_UPDATE
            damage = lost_value(commits, fv.trace, sv.trace, sw) or (failure_text(victim) if failed else "")
        confidence = 0.6 + 0.2 * correlated + 0.1 * bool(damage) + 0.1 * bool(fr.read_version or sr.read_version)
        conflicting = [fr, fw, sr, sw]
        involved = [x for x in (*a.all, *b.all)]
        return collision_of(anomaly, key, culprit, victim, involved, conflicting, commits, damage, confidence,
                            evidence, (key,), correlated, self._writers(culprit, victim), invariant)  # fmt: skip

    def _duplicate(self, key: str, state: EntityHistory, a: View, b: View) -> Collision | None:
        ia = [x for x in a.writes if x.operation is DbOperation.INSERT and x.lock is UNGUARDED and x.keyed]
        ib = [x for x in b.writes if x.operation is DbOperation.INSERT and x.lock is UNGUARDED and x.keyed]
        if not (ia and ib) or abs(ia[0].start_ns - ib[0].start_ns) > self.window_ns or "=" not in key:
            return None  # only inserts of a configured identity (``table:col=value``) share a row key
        culprit, victim = (ia[0], ib[0]) if ia[0].start_ns <= ib[0].start_ns else (ib[0], ia[0])
        created = [c for c in state.commits if c.change.op is CdcOp.CREATE]
        applied = sum(1 for x in (culprit, victim) if not x.error)
        damage = ""
        if len(created) >= 2:
            lsns = ", ".join(str(c.change.lsn) for c in created)
            damage = f"{len(created)} rows committed for one {key} (lsn {lsns})"
        elif applied == 2 and not created:
            damage = f"both inserts for {key} succeeded"
        evidence = [f"{x.function or x.service} inserted {key} unguarded: {x.statement}" for x in (culprit, victim)]
        evidence += [commit_line(c) for c in created]
        confidence = 0.7 + 0.2 * (len(created) >= 2) + 0.1 * bool(culprit.idempotency_key or victim.idempotency_key)
        return collision_of(Anomaly.DUPLICATE_APPLY, key, culprit, victim, [*a.all, *b.all], [culprit, victim],
                            created, damage, confidence, evidence, (key,), bool(created),
                            self._writers(culprit, victim))  # fmt: skip

    def _writers(self, culprit: Access, victim: Access) -> tuple[Access, ...]:
        """Every write of the row around the pair (by key, or credited with one of its changes)."""
        lo = min(culprit.start_ns, victim.start_ns) - self.window_ns
        hi = max(culprit.end_ns, victim.end_ns) + self.window_ns
        return tuple(x for x in self._row_writes if lo <= x.start_ns <= hi)


__all__ = ["PairJudge"]
