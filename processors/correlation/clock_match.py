"""The one assignment of tied row changes to their writers that a single clock offset allows (stage 2).

k row changes of several rows, tied among the same k writers on values and time (statements without their
parameters, run close together), are not decided by each change's own time window: the skew tolerance
(``correlation.skew_ms``) lets a change be made by any writer within that many milliseconds of it. But the
tolerance stands for the *offset* between the service's clocks and the database's, and that offset is one number
for all of them (the instances of a service differ from one another by at most ``clock_jitter_ms``), not a fresh
choice per change. So: an assignment is possible when one offset δ within ``±skew_ms`` (each writer's within
``clock_jitter_ms`` of it) puts every change's commit between its writer's statement end and its request's end, and
each row's changes in its writers' order (the second writer of a row waited for the first one's lock). When exactly
one assignment is possible over every such δ, it is the writers' (strength ``commit_order``); when several are, the
changes stay tied (never guessed). The search is bounded (``MAX_CHANGES``, ``MAX_STEPS``): past it, tied.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from processors.model.events import Access, RowChange
from processors.model.units import MS_NS

MAX_CHANGES: Final = 12  # more tied changes than this are not searched
MAX_STEPS: Final = 20_000  # search steps per group, over every offset tried

Writer = tuple[str, str]  # (trace id, span id)


def _window(change: RowChange, a: Access, upper: int, skew_ns: int, jitter_ns: int) -> tuple[int, int] | None:
    """The offsets δ (database clock minus the writer's) under which ``a`` can have made ``change``, or None."""
    lo = change.commit_ts_ms * MS_NS
    hi = lo + MS_NS - 1  # source.ts_ms is truncated to the millisecond
    least, most = max(-skew_ns, lo - upper) - jitter_ns, min(skew_ns, hi - a.end_ns) + jitter_ns
    return (least, most) if least <= most else None


def one_assignment(
    changes: Sequence[RowChange],
    candidates: Sequence[Sequence[Access]],
    upper: Callable[[Access], int],
    skew_ns: int,
    jitter_ns: int,
) -> list[Access] | None:
    """The writer of each change (in the order given: commit order) when exactly one assignment fits one clock
    offset; None when none, several, or the search is past its bounds. ``candidates[i]`` are the writers
    ``changes[i]`` is tied among; ``upper(a)`` is the latest time ``a``'s commit can be (its request's end)."""
    writers = {(a.trace_id, a.span_id): a for cands in candidates for a in cands}
    if len(changes) > MAX_CHANGES or len(writers) != len(changes) or len({a.service for a in writers.values()}) != 1:
        return None
    windows: list[list[tuple[Access, int, int]]] = []
    for change, cands in zip(changes, candidates, strict=True):
        fits = [(a, *w) for a in cands if (w := _window(change, a, upper(a), skew_ns, jitter_ns)) is not None]
        windows.append(sorted(fits, key=lambda f: (f[0].end_ns, f[0].span_id)))
    previous = [_previous_of_row(changes, i) for i in range(len(changes))]
    found: set[tuple[Writer, ...]] = set()
    steps = [0]
    for delta in sorted({least for fits in windows for _, least, _ in fits}):  # where some window opens
        edges = [[a for a, least, most in fits if least <= delta <= most] for fits in windows]
        if not _search(edges, previous, [], set(), found, steps):
            return None  # several assignments, or past the bounds
    if len(found) != 1:
        return None
    (only,) = found
    return [writers[w] for w in only]


def _previous_of_row(changes: Sequence[RowChange], i: int) -> int | None:
    """The index of the change of the same row just before ``changes[i]``, if any."""
    for j in range(i - 1, -1, -1):
        if changes[j].entity_key == changes[i].entity_key:
            return j
    return None


def _search(edges: list[list[Access]], previous: list[int | None], chosen: list[Access], used: set[Writer],
            found: set[tuple[Writer, ...]], steps: list[int]) -> bool:  # fmt: skip
    """Every complete assignment into ``found``; False as soon as there are two, or the steps run out."""
    steps[0] += 1
    if steps[0] > MAX_STEPS:
        return False
    i = len(chosen)
    if i == len(edges):
        found.add(tuple((a.trace_id, a.span_id) for a in chosen))
        return len(found) < 2
    before = previous[i]
    for a in edges[i]:
        if (a.trace_id, a.span_id) in used or (before is not None and a.end_ns <= chosen[before].end_ns):
            continue  # a writer makes one change; a row's later change is its later writer's
        chosen.append(a)
        used.add((a.trace_id, a.span_id))
        fine = _search(edges, previous, chosen, used, found, steps)
        used.discard((a.trace_id, a.span_id))
        chosen.pop()
        if not fine:
            return False
    return True
