"""Critical-path ownership: the last-finishing child owns its time, gaps are self time, parallel work owns nothing."""

from __future__ import annotations

import random

from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.pipeline.critical_path import children_by_end, critical_path, shares, shift

MS = 1_000_000


def span(sid: int, service: str, start_ms: int, end_ms: int, parent: int = 0, *, db: bool = False) -> Span:
    return Span("t" * 32, f"{sid:016x}", f"{parent:016x}" if parent else "", f"op{sid}",
                SpanKind.CLIENT if db else SpanKind.INTERNAL, start_ms * MS, end_ms * MS, StatusCode.UNSET,
                Resource(service), db=DbCall("postgresql", "SELECT 1") if db else None)  # fmt: skip


def test_sequential_children_own_their_time_and_gaps_are_self_time() -> None:
    """Root 0-100 calling a (10-40) then b (50-90): a 30, b 40, root 30, summing to the root's duration."""
    spans = [span(1, "root", 0, 100), span(2, "a", 10, 40, 1), span(3, "b", 50, 90, 1)]
    owned = critical_path(spans, spans[0])
    assert owned == {"root": 30 * MS, "a": 30 * MS, "b": 40 * MS}
    assert sum(owned.values()) == 100 * MS


def test_parallel_children_only_the_last_finisher_is_critical() -> None:
    """a (10-80) and b (20-90) in parallel: b owns 20-90, a only the 10-20 before b started."""
    spans = [span(1, "root", 0, 100), span(2, "a", 10, 80, 1), span(3, "b", 20, 90, 1)]
    assert critical_path(spans, spans[0]) == {"root": 20 * MS, "b": 70 * MS, "a": 10 * MS}


def test_nested_database_time_is_owned_by_the_database_system() -> None:
    """A DB client span under a handler is owned by 'postgresql'; the walk recurses into the handler."""
    spans = [span(1, "api", 0, 100), span(2, "api", 5, 95, 1), span(3, "pg", 20, 80, 2, db=True)]
    assert critical_path(spans, spans[0]) == {"api": 40 * MS, "postgresql": 60 * MS}


def test_a_child_running_past_its_parent_is_clipped() -> None:
    """Clock skew: a child ending after its parent owns only up to the parent's end."""
    spans = [span(1, "root", 0, 100), span(2, "late", 60, 130, 1)]
    assert critical_path(spans, spans[0]) == {"root": 60 * MS, "late": 40 * MS}


def test_a_parent_cycle_does_not_loop() -> None:
    """A malformed trace whose spans are each other's parents terminates with every nanosecond owned once."""
    a, b = span(1, "x", 0, 100, 2), span(2, "y", 10, 90, 1)
    assert critical_path([a, b], a) == {"x": 20 * MS, "y": 80 * MS}
    assert critical_path([a, b], a, children_by_end([a, b]), unique=True) == {"x": 20 * MS, "y": 80 * MS}


def test_the_walk_for_unique_span_ids_sums_as_the_general_walk() -> None:
    """``unique=True`` (no seen set) owns the same nanoseconds as the general walk, the owners in the same order
    (the relayed statistics keep it), on random trees with parallel, overlapping, clipped, zero-length and
    database children, and parent cycles."""
    rng = random.Random(7)
    for _ in range(400):
        n = rng.randint(1, 14)
        spans = [span(1, "root", 0, 100, rng.choice([0, 0, 0, n]))]
        for sid in range(2, n + 1):
            start = rng.randint(-10, 100)
            spans.append(span(sid, rng.choice("abc"), start, start + rng.randint(0, 60), rng.randint(1, sid - 1),
                              db=rng.random() < 0.3))  # fmt: skip
        for start in (spans[0], rng.choice(spans)):
            general = critical_path(spans, start)
            fast = critical_path(spans, start, children_by_end(spans), unique=True)
            assert list(fast.items()) == list(general.items())
            assert sum(general.values()) == max(0, start.end_ns - start.start_ns)


def test_shares_and_shift_order_the_largest_move_first() -> None:
    """Shares sum to one; the shift lists the owner whose share moved most first."""
    before = {"api": 60, "postgresql": 40}
    after = {"api": 30, "postgresql": 70}
    assert shares(before) == {"api": 0.6, "postgresql": 0.4}
    moves = shift(before, after)
    assert [(m.owner, m.before, m.after) for m in moves] == [("api", 0.6, 0.3), ("postgresql", 0.4, 0.7)]
    assert moves[0].delta < 0 < moves[1].delta
    assert shares({}) == {}
