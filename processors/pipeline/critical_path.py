"""Critical-path ownership of a request (CRISP style): who the slow part of a trace was waiting on.

Walking back from the end of a span, the child that finishes last (clipped to the part of the span not yet
covered) is on the critical path and owns its interval, recursively; the gaps between such children are the
span's self time. Children that run in parallel with a critical child own nothing. The owner of a span's time
is its service, or, for a database client span, the database system (``postgresql``), as the CALLS edges name it.

The walk is iterative (a trace may be thousands of spans deep) and skips spans reached twice (a malformed trace
with a parent cycle). The owned intervals partition the start span's duration exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from processors.model.events import SpanKind
from processors.model.span import Span


def owner(span: Span) -> str:
    """Who owns a span's self time: its service, or the database system for a DB client span."""
    if span.db is not None and span.kind == SpanKind.CLIENT:
        return span.db.system or "db"
    return span.resource.service


def critical_path(spans: Iterable[Span], start: Span, by_end: Mapping[str, list[Span]] | None = None, *,
                  unique: bool = False) -> dict[str, int]:  # fmt: skip
    """Nanoseconds of ``start``'s duration owned by each owner along its critical path (``by_end``: the spans'
    children, latest end first, as ``processors.model.trace.TraceFacts.by_end`` has them; made here when not
    given). ``unique``: no span id is there twice (``TraceFacts.unique``), so the walk can be :func:`_owned`."""
    children = children_by_end(spans) if by_end is None else by_end
    if unique:
        return _owned(children, start)
    owned: dict[str, int] = {}
    client = SpanKind.CLIENT
    for span, self_ns in _walk(spans, start, children):
        db = span.db  # ``owner``, inlined
        key = (db.system or "db") if db is not None and span.kind == client else span.resource.service
        owned[key] = owned.get(key, 0) + self_ns
    return owned


def _owned(children: Mapping[str, list[Span]], start: Span) -> dict[str, int]:
    """:func:`_walk` summed by owner, for spans whose ids are unique; it runs for every request that enters its
    key's slowest (most of a trace's requests), so it is one loop with what it can spare left out:

    - no set of spans seen: each span is under one parent id, and with unique ids that id is one span's, so a
      span can be reached twice only through a parent cycle back to ``start`` (whose id is never walked into);
    - a span's owner is its service unless it is a CLIENT span with a DB call (the lazy ``db`` read only then).

    The owners come in :func:`_walk`'s order (the relayed statistics keep it), with the same sums."""
    owned: dict[str, int] = {}
    client = SpanKind.CLIENT
    start_id = start.span_id
    kids_of = children.get
    stack: list[tuple[Span, int, int]] = [(start, start.start_ns, start.end_ns)]
    push, pop = stack.append, stack.pop
    while stack:
        span, lo, hi = pop()
        if hi <= lo:
            continue
        cursor = hi
        self_ns = 0
        for kid in kids_of(span.span_id, ()):
            if cursor <= lo:
                break
            if (begin := kid.start_ns) >= cursor or kid.span_id == start_id:
                continue  # after the part still to cover, or in parallel with a critical sibling
            end = kid.end_ns if kid.end_ns < cursor else cursor
            if end <= lo:
                break  # kids are sorted by end: every remaining one ended before this span's interval
            if begin < lo:
                begin = lo
            self_ns += cursor - end
            cursor = begin
            push((kid, begin, end))
        self_ns += cursor - lo
        if self_ns:
            key = span.resource.service
            if span.kind == client and (db := span.db) is not None:
                key = db.system or "db"
            owned[key] = owned.get(key, 0) + self_ns
    return owned


def on_path(spans: Iterable[Span], start: Span, by_end: Mapping[str, list[Span]] | None = None) -> dict[str, int]:
    """Nanoseconds of ``start``'s duration each span owns along its critical path, by span id (spans that own
    nothing are absent): what a group of spans (a query repeated in a loop) costs the request."""
    return {span.span_id: self_ns for span, self_ns in _walk(spans, start, by_end)}


def children_by_end(spans: Iterable[Span]) -> dict[str, list[Span]]:
    """Parent span id -> its children, the latest end first (equal ends in the spans' order)."""
    children: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_id:
            children.setdefault(s.parent_id, []).append(s)
    for kids in children.values():
        kids.sort(key=lambda s: s.end_ns, reverse=True)
    return children


def _walk(spans: Iterable[Span], start: Span, by_end: Mapping[str, list[Span]] | None) -> list[tuple[Span, int]]:
    """Each span on ``start``'s critical path with the nanoseconds of self time it owns there (once per span).
    (Spelt out: it runs for every slow request the regression statistics keep.)"""
    children = children_by_end(spans) if by_end is None else by_end
    start_id = start.span_id  # never a child on its own path (a malformed trace with a parent cycle)
    seen: set[str] = set()
    out: list[tuple[Span, int]] = []
    stack: list[tuple[Span, int, int]] = [(start, start.start_ns, start.end_ns)]
    while stack:
        span, lo, hi = stack.pop()
        if (span_id := span.span_id) in seen or hi <= lo:
            continue
        seen.add(span_id)
        cursor = hi
        self_ns = 0
        for kid in children.get(span_id, ()):
            if cursor <= lo:
                break
            if (kid_start := kid.start_ns) >= cursor or (kid_id := kid.span_id) == start_id or kid_id in seen:
                continue  # after the part still to cover, or in parallel with a critical sibling
            end = kid.end_ns if kid.end_ns < cursor else cursor
            if end <= lo:
                break  # kids are sorted by end: every remaining one ended before this span's interval
            begin = kid_start if kid_start > lo else lo
            self_ns += cursor - end
            stack.append((kid, begin, end))
            cursor = begin
        self_ns += cursor - lo
        if self_ns:
            out.append((span, self_ns))
    return out


def shares(owned: Mapping[str, int]) -> dict[str, float]:
    """Owned nanoseconds as shares of their total (empty when the total is 0)."""
    total = sum(owned.values())
    return {k: v / total for k, v in sorted(owned.items())} if total else {}


@dataclass(frozen=True, slots=True)
class PathShift:
    """How one owner's share of the critical path moved between two builds or periods."""

    owner: str
    before: float
    after: float

    @property
    def delta(self) -> float:
        return self.after - self.before


def shift(before: Mapping[str, int], after: Mapping[str, int]) -> list[PathShift]:
    """Share of each owner before and after, the largest moves first."""
    b, a = shares(before), shares(after)
    moves = [PathShift(k, round(b.get(k, 0.0), 4), round(a.get(k, 0.0), 4)) for k in sorted(set(b) | set(a))]
    return sorted(moves, key=lambda m: (-abs(m.delta), m.owner))
