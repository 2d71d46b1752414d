"""What the collision judge works on: a row's bounded history, the memory beyond it, one trace's view of the row, the
collision it finds; and the small readings of them (the image a statement saw, whether a predicate selects a row,
the evidence lines)."""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from processors.correlation.keying import undecided
from processors.detectors.collisions.pending import PendingInputs
from processors.lib.invariants import Invariant
from processors.model.anomaly import Anomaly
from processors.model.events import Access, Commit, DbOperation, LockMode
from processors.model.units import MS_NS
from processors.sql.values import covers
from processors.state.lru import CountedLRU

UNGUARDED = LockMode.NONE
LOCKED_READS = (LockMode.FOR_UPDATE, LockMode.FOR_SHARE)
WRITES = (DbOperation.WRITE, DbOperation.INSERT, DbOperation.DELETE)
ADYA = {
    Anomaly.LOST_UPDATE: "G-single",
    Anomaly.INVARIANT_VIOLATION: "G-single",
    Anomaly.DUPLICATE_APPLY: "G2",
    Anomaly.WRITE_SKEW: "G2-item",
    Anomaly.PHANTOM: "G2",
    Anomaly.READ_SKEW: "G-single",
}


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
    adya: str = ""
    entities: tuple[str, ...] = ()  # every row involved (one for single-row classes)
    correlated: bool = True  # the row changes were credited to the traces (else: classified by statements)
    invariant: str = ""  # the configured invariant an invariant violation broke ("": none broken, the victim failed)

    @property
    def pair(self) -> str:
        """The rows and the two traces, whatever the class: judged again on later input (a late row change, more
        of a trace), a pair already reported is not reported again under another class."""
        where = "+".join(self.entities) or self.entity
        a, b = sorted((self.culprit.trace_id, self.victim.trace_id))
        return hashlib.sha256(f"{where}|{a}|{b}".encode()).hexdigest()[:16]

    @property
    def window_ms(self) -> float:
        times = [a.start_ns for a in self.accesses] + [a.end_ns for a in self.accesses]
        return (max(times) - min(times)) / 1e6


@dataclass(slots=True)
class EntityHistory:
    """What one row (or, for ``table:*``, one table's predicate statements) has seen lately, bounded."""

    accesses: deque[Access]
    commits: deque[Commit]
    last_ns: int = 0  # the newest event time seen
    judged_until_ns: int = -1  # the judging horizon reached so far
    changed_ns: int = -1  # the newest commit time of a change of the row (of any row of the table, for a scope)
    judged: set[str] = field(default_factory=set)  # traces whose pairs have been judged (pruned with the history)
    inputs: PendingInputs = field(default_factory=PendingInputs)  # the detector's keys for the input not judged yet
    part: str = ""  # the internal partition that fed it last (``CollisionDetector.on_revoke``)


@dataclass(slots=True)
class Memory:
    """What the judge may look up beyond the row being judged."""

    by_trace: CountedLRU[str, list[Access]]  # every access of a recent trace, on every row and table
    commits: CountedLRU[str, list[tuple[str, Commit]]]  # (row, commit) credited to a recent trace
    scope: Callable[[str], EntityHistory | None]  # a table's predicate statements (``table:*``)


@dataclass(slots=True)
class View:
    """What one trace did to the row being judged."""

    trace: str
    reads: list[Access] = field(default_factory=list)  # unlocked reads of a version of the row
    locked: list[Access] = field(default_factory=list)  # reads that locked it
    writes: list[Access] = field(default_factory=list)  # statements that wrote it (keyed, or credited)
    commits: list[Commit] = field(default_factory=list)  # its committed changes of the row
    moved: list[Access] = field(default_factory=list)  # predicate reads a change of the row moved in or out
    all: list[Access] = field(default_factory=list)  # every statement above

    @property
    def end_ns(self) -> int:
        return max(a.end_ns for a in self.all) if self.all else 0


def fingerprint(anomaly: str, table: str, accesses: Iterable[Access]) -> str:
    """Same defect, same fingerprint: the anomaly, the table, and the code and statements that formed it.

    Row keys, trace ids, parameters, times and which side happened to commit first are left out, so every
    occurrence of one defect shares it, however its row changes were correlated.
    """
    sites = sorted({f"{a.service}|{a.function}|{a.operation.value}|{a.statement}" for a in accesses})
    digest = hashlib.sha256("\n".join([anomaly, table, *sites]).encode()).hexdigest()
    return digest[:16]


def occurrence_id(fp: str, where: str, culprit: Access, victim: Access) -> str:
    return hashlib.sha256(f"{fp}|{where}|{culprit.trace_id}|{victim.trace_id}".encode()).hexdigest()[:16]


def independent(a: str, b: str, memory: Memory) -> bool:
    """Different traces, neither linked to the other."""
    la, lb = memory.by_trace.peek(a), memory.by_trace.peek(b)
    return a != b and not (la and b in la[0].links) and not (lb and a in lb[0].links)


def commit_ns(c: Commit) -> int:
    return c.change.commit_ts_ms * MS_NS


def image_at(commits: Sequence[Commit], at_ns: int) -> Mapping[str, Any] | None:
    """The row's image a statement starting at ``at_ns`` saw (READ COMMITTED: the newest committed before it)."""
    seen: Mapping[str, Any] | None = None
    for c in commits:  # in commit order
        if commit_ns(c) + MS_NS <= at_ns:
            seen = c.change.after
        elif seen is None:
            return c.change.before
        else:
            break
    return seen


def absolute_columns(write: Access) -> list[str]:
    """The columns a write sets to a value it brought (not ``col = col ± x`` or another SQL expression), whether or
    not the span carried the value."""
    exprs = set(write.set_exprs)
    columns = write.set_columns or tuple(column for column, _ in write.set_values)
    return [column for column in columns if column not in exprs]


def moves_row(read: Access, commit: Commit, on_undecidable: Callable[[str], None] | None = None) -> bool | None:
    """Whether ``commit`` moved its row into or out of what the predicate read selects (both sides known); None when
    it *may* have: the read's WHERE has terms whose values the span did not carry, and on the side they leave open
    the row may match while on the other it does not (undecidable is never taken for "no match"). A predicate an
    image cannot decide for another reason (an unknown function, a missing column) goes to ``on_undecidable``."""
    was = covers(read.predicates, read.exact, commit.change.before, read.where, on_undecidable)
    now = covers(read.predicates, read.exact, commit.change.after, read.where, on_undecidable)
    if was is not None and now is not None:
        return was != now
    return None if undecided(read) and False in (was, now) else False


def reads_row(read: Access, row: str, image: Mapping[str, Any] | None) -> bool | None:
    """Whether a read statement read ``row`` (by its key, or by a predicate that selects ``image``); None when it
    may have (its WHERE has terms whose values the span did not carry and none of the others excludes the row)."""
    if read.keyed:
        return read.entity == row
    selects = covers(read.predicates, read.exact, image, read.where)
    if selects is None and image is not None and undecided(read):
        return None
    return selects is True


def read_verb(seen: bool | None) -> str:
    """How sure a read of a row is: "read", or "may have read" (its WHERE's values were not on the span)."""
    return "read" if seen else "may have read (the values of its WHERE are not on its span)"


def what_read(read: Access, row: str) -> str:
    return row if read.keyed else f"the rows of {read.table} its predicate selects"


def broken_invariant(rules: Sequence[Invariant], commits: Iterable[Commit], since_ms: int) -> tuple[str, str]:
    """The first committed image since ``since_ms`` that breaks one of ``rules`` (configured invariants): (the
    damage for people, the invariant's text for machines), or ("", "")."""
    for c in commits:
        if c.change.after is None or c.change.commit_ts_ms < since_ms:
            continue
        for rule in rules:
            if rule.holds(c.change.after) is False:
                shown = ", ".join(f"{col} = {c.change.after.get(col)!r}" for col in rule.columns)
                return f"committed {shown} violates {rule.text} (lsn {c.change.lsn})", rule.text
    return "", ""


def failure_text(victim: Access) -> str:
    return f"victim failed: {victim.trace_exception or 'error'} (HTTP {victim.trace_status or '-'})"


def ms_from(ns: int, origin_ns: int) -> str:
    return f"{(ns - origin_ns) / 1e6:+.1f}"


def commit_line(c: Commit) -> str:
    who = f"trace {c.trace_id[:8]} ({c.strength})" if c.trace_id else "an uncorrelated writer"
    change = f"{image_text(c.change.before)} -> {image_text(c.change.after)}"
    return f"lsn {c.change.lsn} tx {c.change.tx_id}: {change} by {who}"


def image_text(row: Mapping[str, Any] | None) -> str:
    if row is None:
        return "∅"
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(row.items())) + "}"


def add_access(v: View, a: Access) -> None:
    if a in v.all:
        return
    v.all.append(a)
    if a.operation is DbOperation.READ:
        (v.reads if a.lock is UNGUARDED else v.locked).append(a)
    else:
        v.writes.append(a)


def write_order(a: View, b: View, wa: Access, wb: Access) -> tuple[tuple[View, Access, Access],
                                                              tuple[View, Access, Access]]:  # fmt: skip
    """(view, its write, its read) of the first writer, then of the second: by commit order when both
    committed changes are known, else by statement order."""
    a_first = wa.start_ns <= wb.start_ns
    if a.commits and b.commits:
        a_first = a.commits[0].change.lsn < b.commits[0].change.lsn
    first, second = ((a, wa), (b, wb)) if a_first else ((b, wb), (a, wa))
    return (first[0], first[1], first[0].reads[0]), (second[0], second[1], second[0].reads[0])


def lost_value(commits: Sequence[Commit], first: str, second: str, victim: Access) -> str:
    mine = [c for c in commits if c.trace_id == first]
    theirs = [c for c in commits if c.trace_id == second]
    if not mine or not theirs or mine[0].change.lsn > theirs[-1].change.lsn:
        return ""
    before, last = mine[0].change.after or {}, theirs[-1].change.after or {}
    lost = {col: before.get(col) for col in absolute_columns(victim) if before.get(col) != last.get(col)}
    if not lost:
        return ""
    shown = ", ".join(f"{col} = {val!r} overwritten by {last.get(col)!r}" for col, val in sorted(lost.items()))
    return f"value lost: {shown}"


def credited_statement(trace: str, commit: Commit, memory: Memory) -> Access | None:
    """The statement credited with ``commit`` (None once the trace fell out of ``max_traces``)."""
    return next((a for a in memory.by_trace.peek(trace) or () if a.span_id == commit.span_id), None)


def collision_of(anomaly: str, key: str, culprit: Access, victim: Access, involved: Sequence[Access],
                 conflicting: Sequence[Access], commits: Sequence[Commit], damage: str, confidence: float,
                 evidence: list[str], rows: tuple[str, ...], correlated: bool,
                 writers: tuple[Access, ...] | None = None, invariant: str = "") -> Collision:  # fmt: skip
    """The collision found on ``key``: fingerprinted by its class, table and ``conflicting`` statements, no surer than
    their least sure inferred key; ``writers`` the row's writes around the pair (else the conflicting writes)."""
    fp = fingerprint(anomaly, culprit.table, conflicting)
    confidence = min(confidence, *(a.key_confidence for a in conflicting))  # no surer than an inferred key
    where = key if len(rows) == 1 else "+".join(rows)
    return Collision(
        anomaly=anomaly,
        manifest=bool(damage),
        entity=key,
        table=culprit.table,
        culprit=culprit,
        victim=victim,
        writers=writers if writers is not None else tuple(x for x in conflicting if x.operation in WRITES),
        accesses=tuple(sorted(dict.fromkeys(involved), key=lambda x: (x.start_ns, x.span_id))),
        commits=tuple(commits),
        damage=damage,
        confidence=round(min(confidence, 1.0), 2),
        evidence=tuple(evidence),
        fingerprint=fp,
        occurrence=occurrence_id(fp, where, *sorted((culprit, victim), key=lambda x: x.trace_id)),
        adya=ADYA.get(Anomaly(anomaly), ""),
        entities=rows,
        correlated=correlated, invariant=invariant,
    )  # fmt: skip
