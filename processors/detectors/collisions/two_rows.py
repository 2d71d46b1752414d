"""The collision judge's two-row classes: write skew and phantom (A →rw B →rw A over two rows, both committed) and
read skew (A →rw B →wr A: a reader saw one row before a writer's transaction and another after it). The classes and
their evidence are described in :mod:`~processors.detectors.collisions.classify`, which judges each pair of traces
on one row first, then by these."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from processors.detectors.collisions.views import (
    UNGUARDED,
    Collision,
    Memory,
    collision_of,
    commit_line,
    commit_ns,
    credited_statement,
    failure_text,
    moves_row,
    read_verb,
    reads_row,
    what_read,
)
from processors.model.anomaly import Anomaly
from processors.model.events import Access, CdcOp, Commit, DbOperation
from processors.model.units import MS_NS


class TwoRows:
    """Finds the two-row classes between two independent traces, from the memory of their statements and changes:
    a read is before (after) a change when it ended (started) within ``window_ns`` of it, commit times trusted to
    ``skew_ns``; ``moves`` says whether a change moved a row into or out of what a predicate read selects."""

    def __init__(self, window_ns: int, skew_ns: int, moves: Callable[[Access, Commit], bool | None]) -> None:
        self.window_ns = window_ns
        self.skew_ns = skew_ns
        self._moves = moves

    def _before(self, read: Access, commit: Commit, made: Access | None) -> bool:
        """Whether ``read`` ended before ``commit`` could be seen: before the statement that made it started (span
        clocks), or before the commit time by more than the tolerated skew (the database's clock)."""
        if made is not None and read.end_ns < made.start_ns:
            return made.start_ns - read.end_ns <= self.window_ns
        at = commit_ns(commit) - self.skew_ns
        return read.end_ns < at and at - read.end_ns <= self.window_ns

    def _after(self, read: Access, commits: Sequence[Commit], made: Sequence[Access]) -> bool:
        """Whether ``read`` started after every one of ``commits`` was visible: after the writer's request ended
        (span clocks), or after the last commit time by more than the tolerated skew."""
        if made and all(m.request_end_ns and read.start_ns > m.request_end_ns for m in made):
            return True
        return read.start_ns > max(map(commit_ns, commits)) + MS_NS + self.skew_ns

    def _rw(self, reader: str, commit: Commit, row: str, made: Access | None, memory: Memory) -> Access | None:
        """The read of ``reader`` that ``commit`` (of another trace, on ``row``) came after and changed, if any."""
        table = row.partition(":")[0]
        inserted = commit.change.op is CdcOp.CREATE
        for r in memory.by_trace.peek(reader) or ():
            if r.table != table or not self._before(r, commit, made):
                continue
            if r.operation is not DbOperation.READ and r.keyed:
                continue
            if r.keyed:
                if r.entity == row and r.lock is UNGUARDED:
                    return r  # read the row by key before it changed
            elif (r.operation is DbOperation.READ and (inserted or r.lock is UNGUARDED)
                  and self._moves(r, commit) is not False):  # fmt: skip
                return r  # the change moved (or may have moved) the row into or out of what its predicate selects
        return None

    def cycle(self, key: str, a: str, b: str, memory: Memory) -> Collision | None:
        """A →rw B →rw A over two different rows, both committed: write skew, or a phantom through inserts."""
        ca = [(row, c) for row, c in memory.commits.peek(a) or () if c.change.op is not CdcOp.READ]
        cb = [(row, c) for row, c in memory.commits.peek(b) or () if c.change.op is not CdcOp.READ]
        for x, commit_a in ca:
            read_b = self._rw(b, commit_a, x, credited_statement(a, commit_a, memory), memory)
            if read_b is None:
                continue
            for y, commit_b in cb:
                if y == x or key not in (x, y):
                    continue
                read_a = self._rw(a, commit_b, y, credited_statement(b, commit_b, memory), memory)
                if read_a is None:
                    continue
                found = self._skew(key, (a, x, commit_a, read_a), (b, y, commit_b, read_b), memory)
                if found is not None:
                    return found
        return None

    def _skew(self, key: str, one: tuple[str, str, Commit, Access], other: tuple[str, str, Commit, Access],
              memory: Memory) -> Collision | None:  # fmt: skip
        first, second = sorted((one, other), key=lambda side: side[2].change.lsn)
        (t1, row1, c1, read1), (t2, row2, c2, read2) = first, second
        w1, w2 = credited_statement(t1, c1, memory), credited_statement(t2, c2, memory)
        if w1 is None or w2 is None:
            return None
        culprit, victim = (w1, w2) if not (w1.trace_error and not w2.trace_error) else (w2, w1)
        inserts = CdcOp.CREATE in (c1.change.op, c2.change.op)
        anomaly = Anomaly.PHANTOM if inserts else Anomaly.WRITE_SKEW
        rows = tuple(sorted({row1, row2}))
        verb = "inserted" if inserts else "changed"
        damage = (
            f"both committed: {w1.function or w1.service} {verb} {row1} (lsn {c1.change.lsn}) and "
            f"{w2.function or w2.service} {verb} {row2} (lsn {c2.change.lsn}), each after reading what the "
            f"other's change altered"
        )
        sure2, sure1 = (read.keyed or moves_row(read, c) is True for read, c in ((read2, c1), (read1, c2)))
        evidence = [
            f"{read2.function or read2.service} {read_verb(sure2)} {what_read(read2, row1)} before {row1} changed: "
            f"{read2.statement}",
            f"{read1.function or read1.service} {read_verb(sure1)} {what_read(read1, row2)} before {row2} changed: "
            f"{read1.statement}",
            commit_line(c1),
            commit_line(c2),
        ]
        tables = {read1.table, read2.table, w1.table, w2.table}
        involved = [x for t in (t1, t2) for x in memory.by_trace.peek(t) or () if x.table in tables]
        credited = sum(0.1 * (c.strength != "none") + 0.1 * (c.strength not in ("none", "tied")) for c in (c1, c2))
        confidence = 0.7 + 0.1 * (read1.exact and read2.exact) + credited / 2 - 0.2 * (not (sure1 and sure2))
        return collision_of(anomaly, key, culprit, victim, involved, [read1, read2, w1, w2], [c1, c2], damage,
                               confidence, evidence, rows, True)  # fmt: skip

    def read_skew(self, key: str, a: str, b: str, memory: Memory) -> Collision | None:
        """A reader saw one row before a writer's transaction committed and another row after it: read skew."""
        for reader, writer in ((a, b), (b, a)):
            by_tx: dict[str, list[tuple[str, Commit]]] = {}
            for row, c in memory.commits.peek(writer) or ():
                if c.change.tx_id and c.change.op is not CdcOp.READ:
                    by_tx.setdefault(c.change.tx_id, []).append((row, c))
            reads = [r for r in memory.by_trace.peek(reader) or () if r.operation is DbOperation.READ
                     and r.lock is UNGUARDED]  # fmt: skip
            for changes in by_tx.values():
                if len({row for row, _ in changes}) < 2 or key not in {row for row, _ in changes}:
                    continue
                commits = [c for _, c in sorted(changes, key=lambda rc: rc[1].change.lsn)]
                made = [m for c in commits if (m := credited_statement(writer, c, memory)) is not None]
                if not made:
                    continue
                first = min(made, key=lambda m: m.start_ns)
                old = [(r, row, seen) for r in reads for row, c in changes if self._before(r, c, first)
                       and (seen := reads_row(r, row, c.change.before)) is not False]  # fmt: skip
                new = [(r, row, seen) for r in reads for row, c in changes if self._after(r, commits, made)
                       and (seen := reads_row(r, row, c.change.after)) is not False]  # fmt: skip
                pairs = [(o, n) for o in old for n in new if o[1] != n[1]
                         and n[0].start_ns - o[0].end_ns <= self.window_ns]  # fmt: skip
                if not pairs:
                    continue  # (the surest pair first: rows read by key or predicate before rows it may have read)
                (before, row_old, sure_old), (after, row_new, sure_new) = max(pairs, key=lambda p: sum(
                    x[2] is True for x in p))  # fmt: skip
                culprit, victim = made[0], after
                damage = failure_text(after) if after.trace_error else ""
                evidence = [
                    f"{before.function or before.service} {read_verb(sure_old)} {row_old} before the transaction of "
                    f"{culprit.function or culprit.service} committed: {before.statement}",
                    f"and {read_verb(sure_new)} {row_new} after it committed: {after.statement}",
                    *(commit_line(c) for c in commits),
                ]
                rows = tuple(sorted({row_old, row_new}))
                confidence = 0.8 if sure_old and sure_new else 0.5
                return collision_of(Anomaly.READ_SKEW, key, culprit, victim, [before, after, *made],
                                       [before, after, *made], commits, damage, confidence, evidence, rows,
                                       True)  # fmt: skip
        return None
