"""The reducer without a database: ddmin finds a 1-minimal set of units within its bounds (runs and wall time on an
injected clock, the bound that stopped it named), and a candidate schedule keeps the commits, the recorded failure,
the statements the repair edits and the recorded order, renumbered."""

from __future__ import annotations

import ast

from processors.repro import compile_repro
from processors.repro.reduce import MAX_RUNS, MAX_SECONDS, ddmin
from processors.repro.schedule import build
from processors.repro.subset import ROW, STEP, Keep, Unit, fixed_steps, removable, subset
from tests.repro.cases import incident

UNITS: list[Unit] = [(STEP, i) for i in range(8)] + [(ROW, j) for j in range(4)]
NEEDED = {(STEP, 2), (STEP, 7), (ROW, 1)}


def _needs(candidate: list[Unit]) -> str | None:
    return "same failure" if set(candidate) >= NEEDED else None


def test_ddmin_keeps_exactly_the_units_the_failure_needs() -> None:
    """Twelve units, three needed: the search ends with those three, unbounded, each candidate tried once."""
    seen: list[frozenset[Unit]] = []

    def check(candidate: list[Unit]) -> str | None:
        seen.append(frozenset(candidate))
        return _needs(candidate)

    found = ddmin(UNITS, check, max_runs=1000, max_seconds=1e9)
    assert set(found.kept) == NEEDED
    assert (found.accepted, found.stopped_by, found.runs) == ("same failure", "", len(seen))
    assert len(set(seen)) == len(seen)  # no candidate twice
    assert frozenset(UNITS) not in seen  # the full set is the reference, never a candidate


def test_the_run_bound_stops_the_search_and_names_itself() -> None:
    """At ``max_runs`` candidates the search stops with the smallest accepted set so far, which still holds what
    the failure needs."""
    accepted: list[list[Unit]] = []

    def check(candidate: list[Unit]) -> str | None:
        found = _needs(candidate)
        if found is not None:
            accepted.append(candidate)
        return found

    unbounded = ddmin(UNITS, _needs, max_runs=1000, max_seconds=1e9).runs
    found = ddmin(UNITS, check, max_runs=unbounded - 1, max_seconds=1e9)
    assert (found.runs, found.stopped_by) == (unbounded - 1, MAX_RUNS)
    assert accepted and found.kept == accepted[-1] and set(found.kept) >= NEEDED
    assert len(found.kept) < len(UNITS)


def test_the_time_bound_stops_the_search_on_the_injected_clock() -> None:
    """Each candidate takes ten seconds on the clock: a 25 s bound allows three."""
    now = [0.0]

    def check(candidate: list[Unit]) -> str | None:
        now[0] += 10.0
        return _needs(candidate)

    found = ddmin(UNITS, check, max_runs=1000, max_seconds=25.0, clock=lambda: now[0])
    assert (found.runs, found.stopped_by) == (3, MAX_SECONDS)


def test_nothing_accepted_keeps_everything() -> None:
    found = ddmin(UNITS, lambda c: None, max_runs=1000, max_seconds=1e9)
    assert (set(found.kept), found.accepted, found.stopped_by) == (set(UNITS), None, "")


def test_a_candidate_keeps_commits_the_repaired_statement_and_the_recorded_order() -> None:
    """The shop's lost update with every removable step dropped: both COMMITs and the read the repair locks stay, in
    their recorded order and renumbered; the compiled test carries exactly those steps, and its production sequence
    matches them."""
    shop = incident("lost_update")
    schedule = build(shop)
    read = "SELECT status, version, amount FROM orders WHERE id = %s"
    fixed = fixed_steps(schedule, [read])
    assert {schedule.steps[i].kind for i in fixed} == {"commit", "read"}
    units = removable(schedule, fixed)
    assert all(kind == ROW or i not in fixed for kind, i in units)
    keep = Keep.of([u for u in units if u[0] == ROW], fixed)
    part = subset(schedule, keep)
    assert [s.index for s in part.steps] == list(range(len(fixed)))
    assert [(s.session, s.kind, s.statement) for s in part.steps] == [
        (s.session, s.kind, s.statement) for s in schedule.steps if s.index in fixed
    ]
    test = compile_repro(shop, keep=keep)
    assigned = {n.target.id: n.value for n in ast.parse(test.source).body
                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}  # fmt: skip
    steps = ast.literal_eval(assigned["STEPS"])
    assert [(s["session"], s["kind"]) for s in steps] == [(s.session, s.kind) for s in part.steps]
    assert [e.step for e in test.production_sequence] == list(range(len(part.steps)))
    assert "EVIDENCE" not in assigned  # no packet given: none emitted (the goldens stay as they are)


def test_with_reduction_off_nothing_is_run_or_removed() -> None:
    """``[repro] reduce = false``: the full repro is the result, no candidate is compiled or run, nothing counted."""
    from processors.api.telemetry import Telemetry
    from processors.connectors.repro.config import ReproConfig
    from processors.connectors.repro.reduction import reduce_red
    from processors.model.outputs import DivergenceInfo, RunInfo
    from processors.repro.reduce import Outcome

    shop = incident("lost_update")
    full = compile_repro(shop)
    red = Outcome(RunInfo(status="failed", failure="lost update", duration_ms=1.0),
                  DivergenceInfo(faithful=True, index=None, expected=None, actual=None, mismatch=None))  # fmt: skip

    def never(*_: object) -> Outcome:
        raise AssertionError("nothing runs with reduction off")

    telemetry = Telemetry("repro")
    reduced = reduce_red(ReproConfig(reduce=False), shop, full, red, level="sql", plan=None, make=never, run=never,
                         telemetry=telemetry)  # fmt: skip
    assert (reduced.keep, reduced.test, reduced.runs, reduced.removed_steps, reduced.removed_rows) == (
        Keep(),
        full,
        0,
        [],
        [],
    )
    assert telemetry.events == {}


def test_the_full_repro_is_shipped_when_the_repairs_green_does_not_hold_on_the_reduced_one() -> None:
    """GREEN fails on the reduced repro and passes on the full one: the full one is shipped, with its GREEN run, and
    the packet says why and removes nothing."""
    from processors.connectors.repro.config import ReproConfig
    from processors.connectors.repro.reduction import ship
    from processors.model.outputs import DivergenceInfo, RunInfo
    from processors.repro.reduce import Outcome, Reduced

    shop = incident("lost_update")
    full = compile_repro(shop)
    faithful = DivergenceInfo(faithful=True, index=None, expected=None, actual=None, mismatch=None)
    red = Outcome(RunInfo(status="failed", failure="lost update", duration_ms=1.0), faithful)
    keep = Keep(frozenset({0}), frozenset({0}))
    reduced = Reduced(keep, compile_repro(shop, keep=keep), red, [1, 2], [], 3, "", [0])
    runs: list[Keep] = []

    def green(kept: Keep) -> RunInfo:
        runs.append(kept)
        return RunInfo(status="failed" if kept == keep else "passed", failure="", duration_ms=1.0)

    shipped = ship(ReproConfig(), shop, full, red, reduced, level="sql", green=green, dsn="", settings={})
    assert runs == [keep, Keep()]
    assert (shipped.keep, shipped.full, shipped.green) == (Keep(), None, RunInfo(status="passed", failure="",
                                                                                   duration_ms=1.0))  # fmt: skip
    record = shipped.evidence["reduction"]
    assert (record["shipped"], record["removed_steps"], record["steps"]["kept"]) == (
        "full",
        [],
        len(full.schedule.steps),
    )
    assert "did not pass on the reduced repro" in record["why"]
