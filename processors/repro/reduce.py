"""Delta debugging of a repro: the fewest recorded steps and seed rows that still fail the same way.

Zeller's ddmin over the removable units of the schedule (:mod:`processors.repro.subset`: the statements that are not
commits, not the recorded failure and not edited by the repair, and the seed rows), in its complement-only form: the
units are split in ``n`` chunks and the units without one chunk are tried as a candidate; an accepted candidate
becomes the current set (``n`` one less), else the chunks are halved until they are single units, so the result is
1-minimal (no single unit of it can go). A chunk alone is not tried: the statements that make a race are spread over
both sessions, so a small chunk alone hardly ever fails the same way, and every run is a real run.

Each candidate is compiled and run on the real scratch database, and accepted only when it fails the same way as the
full repro: RED with the same verdict (the ``DefectReproduced`` message, word for word) and the same first
divergence (faithful both, or diverging the same way: mismatch, expected and actual statement). A candidate that does
not compile is refused (it counts as a candidate).

The statements are reduced first, then the seed rows (a row can go only once the statements that read it have gone);
each phase's result is 1-minimal given the other's.
The search is bounded by a number of candidate runs and by wall time (the injected clock); when a bound stops it,
the smallest accepted candidate so far is the result and ``stopped_by`` names the bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from processors.model.outputs import DivergenceInfo, RunInfo
from processors.repro.compiler import GeneratedTest
from processors.repro.schedule import Schedule
from processors.repro.statements import ReproError
from processors.repro.subset import ROW, STEP, Keep, Unit, removable

T = TypeVar("T")
MAX_RUNS = "max_runs"
MAX_SECONDS = "max_seconds"


class _Exhausted(Exception):
    def __init__(self, bound: str) -> None:
        super().__init__(bound)
        self.bound = bound


@dataclass(frozen=True, slots=True)
class Search(Generic[T]):
    """What ddmin found: the units kept, the payload of the last accepted candidate (None: none was), the runs it
    made and the bound that stopped it (``""``: it finished)."""

    kept: list[Unit]
    accepted: T | None
    runs: int
    stopped_by: str


def ddmin(units: Sequence[Unit], check: Callable[[list[Unit]], T | None], *, max_runs: int, max_seconds: float,
          clock: Callable[[], float] = time.monotonic) -> Search[T]:  # fmt: skip
    """The smallest subset of ``units`` that ``check`` accepts (returns a payload for), by ddmin within the bounds;
    ``check`` is called once per distinct candidate (each counted against ``max_runs``), the full set never (it is
    the reference)."""
    started = clock()
    current = list(units)
    tried: set[frozenset[Unit]] = {frozenset(current)}
    accepted: T | None = None
    runs = 0

    def attempt(candidate: list[Unit]) -> bool:
        nonlocal runs, accepted
        key = frozenset(candidate)
        if key in tried:
            return False
        if runs >= max_runs:
            raise _Exhausted(MAX_RUNS)
        if clock() - started >= max_seconds:
            raise _Exhausted(MAX_SECONDS)
        tried.add(key)
        runs += 1
        found = check(candidate)
        if found is None:
            return False
        accepted = found
        return True

    n = 2
    stopped = ""
    try:
        while current:
            chunks = _split(current, min(n, len(current)))
            rest = next((r for c in chunks if attempt(r := [u for u in current if u not in c])), None)
            if rest is not None:
                current, n = rest, max(n - 1, 2)
                continue
            if n >= len(current):
                break
            n = min(2 * n, len(current))
    except _Exhausted as exc:
        stopped = exc.bound
    return Search(current, accepted, runs, stopped)


def _split(units: list[Unit], n: int) -> list[list[Unit]]:
    size, extra = divmod(len(units), n)
    out, at = [], 0
    for i in range(n):
        end = at + size + (1 if i < extra else 0)
        out.append(units[at:end])
        at = end
    return out


@dataclass(frozen=True, slots=True)
class Outcome:
    """A run's verdict and first divergence: what "fails the same way" compares."""

    red: RunInfo
    divergence: DivergenceInfo

    def same_as(self, other: Outcome) -> bool:
        """RED both, with the same verdict and the same first divergence."""
        mine, theirs = self.divergence, other.divergence
        return (
            self.red.status == other.red.status == "failed"
            and self.red.failure == other.red.failure
            and (mine.faithful, mine.mismatch, mine.expected, mine.actual)
            == (theirs.faithful, theirs.mismatch, theirs.expected, theirs.actual)
        )


@dataclass(frozen=True, slots=True)
class Reduced:
    """A reduced repro: what it keeps, its test and run, and what the search removed, ran and was stopped by."""

    keep: Keep
    test: GeneratedTest
    outcome: Outcome
    removed_steps: list[int]
    removed_rows: list[int]
    runs: int
    stopped_by: str
    fixed: list[int] = field(default_factory=list)


def reduce_repro(schedule: Schedule, full: GeneratedTest, reference: Outcome, *, make: Callable[[Keep], GeneratedTest],
                 run: Callable[[GeneratedTest, str], Outcome], fixed: Collection[int], steps: bool, max_runs: int,
                 max_seconds: float, clock: Callable[[], float] = time.monotonic) -> Reduced:  # fmt: skip
    """The smallest candidate of ``schedule`` (the full repro ``full`` ran as ``reference``) that fails the same way;
    ``make`` compiles a Keep, ``run`` runs a test (with a label for its files). Nothing is removed (``full`` is the
    result) when the reference is not RED."""
    units = removable(schedule, fixed, steps=steps)
    if reference.red.status != "failed" or not units:
        return Reduced(Keep(), full, reference, [], [], 0, "", sorted(fixed))

    def check(candidate: list[Unit]) -> tuple[Keep, GeneratedTest, Outcome] | None:
        keep = Keep.of(candidate, fixed)
        try:
            test = make(keep)
        except ReproError:
            return None
        labels.append(f"reduce-{len(labels) + 1}")
        outcome = run(test, labels[-1])
        return (keep, test, outcome) if outcome.same_as(reference) else None

    labels: list[str] = []
    started = clock()
    statements, rows = [u for u in units if u[0] == STEP], [u for u in units if u[0] == ROW]
    first = ddmin(statements, lambda c: check(c + rows), max_runs=max_runs, max_seconds=max_seconds, clock=clock)
    second: Search[tuple[Keep, GeneratedTest, Outcome]] = Search(rows, None, 0, "")
    if not first.stopped_by:  # rows last: a row goes once the statements that read it have gone
        second = ddmin(rows, lambda c: check(first.kept + c), max_runs=max_runs - first.runs,
                       max_seconds=max_seconds - (clock() - started), clock=clock)  # fmt: skip
    runs, stopped = first.runs + second.runs, first.stopped_by or second.stopped_by
    accepted = second.accepted or first.accepted
    if accepted is None:
        return Reduced(Keep(), full, reference, [], [], runs, stopped, sorted(fixed))
    keep, test, outcome = accepted
    kept = set(first.kept + second.kept)
    gone = [u for u in units if u not in kept]
    return Reduced(keep, test, outcome, [i for kind, i in gone if kind == STEP], [i for kind, i in gone if kind == ROW],
                   runs, stopped, sorted(fixed))  # fmt: skip


__all__ = ["MAX_RUNS", "MAX_SECONDS", "Outcome", "Reduced", "Search", "ddmin", "reduce_repro"]
