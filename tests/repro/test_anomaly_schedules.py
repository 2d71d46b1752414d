"""The production schedule of the classes over two rows, without a database: the rows seeded, the key that names
them, the commits given to the traces they were credited to, what each read returned (predicates evaluated on the
known rows), and the stale-read check the generated test carries."""

from __future__ import annotations

import ast

import pytest

from bench.shop.repro_specs import CALL_SPECS
from processors.repro import CallSpec, Param, ReproError, compile_repro
from processors.repro.schedule import build
from tests.repro.anomalies import CASES, CHARGE, COUNT_ON_CALL, GO_OFF_CALL, OFF_CALL, REPO, Recorder


def steps(anomaly: str) -> list[tuple[int, str, int | None, list[object] | None]]:
    return [(s.session, s.kind, s.rows, s.values) for s in build(CASES[anomaly]()).steps]


def test_write_skew_seeds_both_rows_and_counts_them() -> None:
    """Both doctors are seeded from their before-images, named by ``name``; each check counts the two on call."""
    schedule = build(CASES["write_skew"]())
    assert schedule.entities == ["doctors:alice", "doctors:bob"] and schedule.key == {"name": "alice"}
    assert schedule.seed == [
        {"name": "alice", "shift": 1, "on_call": True},
        {"name": "bob", "shift": 1, "on_call": True},
    ]
    assert steps("write_skew") == [
        (1, "read", 1, [2]), (2, "read", 1, [2]), (1, "write", 1, []), (2, "write", 1, []),
        (1, "commit", None, None), (2, "commit", None, None),
    ]  # fmt: skip


def test_phantom_inserts_rows_whose_key_the_database_assigns() -> None:
    """Nothing to seed; the lookups find nothing; the derived table's ``id`` is an identity column (the INSERT does
    not set it) and the ids it returns are not compared."""
    schedule = build(CASES["phantom"]())
    assert (schedule.seed, schedule.key, schedule.entities) == ([], {"id": 17}, ["charges:17", "charges:18"])
    assert schedule.columns[0] == ["id", "bigint", "identity"]
    assert steps("phantom") == [
        (1, "read", 0, None), (2, "read", 0, None), (1, "insert", 1, None), (2, "insert", 1, None),
        (1, "commit", None, None), (2, "commit", None, None),
    ]  # fmt: skip


def test_read_skew_reads_one_row_before_the_transfer_commits_and_one_after() -> None:
    """The audit (session 1) reads a = 50, the transfer (session 2) commits both rows in one transaction, the audit
    reads b = 60."""
    assert steps("read_skew") == [
        (1, "read", 1, [50]), (2, "write", 1, []), (2, "write", 1, []), (2, "commit", None, None),
        (1, "read", 1, [60]), (1, "commit", None, None),
    ]  # fmt: skip


def test_commits_go_to_the_credited_traces_over_two_rows() -> None:
    """Over two rows no lock orders the writers: the second to write may commit first. Its commit comes first."""
    r = Recorder(keys={"doctors": ["name"]})
    file = REPO / "tests" / "repair" / "clinic" / "oncall.py"
    a, b = r.trace("a", GO_OFF_CALL, file), r.trace("b", GO_OFF_CALL, file)
    r.statement(a, 0, COUNT_ON_CALL, (1,))
    r.statement(b, 1, COUNT_ON_CALL, (1,))
    wb = r.statement(b, 3, OFF_CALL, ("bob",))
    wa = r.statement(a, 4, OFF_CALL, ("alice",))
    r.close(a, b)
    r.commit(wa, "doctors", {"name": "alice"}, {"name": "alice", "shift": 1, "on_call": True},
             {"name": "alice", "shift": 1, "on_call": False}, 20)  # fmt: skip
    r.commit(wb, "doctors", {"name": "bob"}, {"name": "bob", "shift": 1, "on_call": True},
             {"name": "bob", "shift": 1, "on_call": False}, 21)  # fmt: skip
    [incident] = r.incidents()
    schedule = build(incident)
    assert [(s.session, s.kind) for s in schedule.steps][-2:] == [(1, "commit"), (2, "commit")]
    assert [s.params for s in schedule.steps if s.kind == "write"] == [["bob"], ["alice"]]


def test_an_invariant_violation_without_an_invariant_is_judged_by_the_stale_read() -> None:
    """With the default configuration the oversell names no invariant: the test checks the stale read; with one
    configured, the invariant on the final row, as before."""
    default = compile_repro(CASES["invariant_violation"]())
    assert default.schedule.invariant is None
    assert "CHECK: dict[str, Any] = {'serial': True, 'failures': {}}" in default.source
    configured = compile_repro(CASES["invariant_violation"](), invariants=["stock >= 0"])
    assert "'invariant': 'stock >= 0'" in configured.source and "'serial'" not in configured.source


@pytest.mark.parametrize("case", list(CASES))
def test_generated_sources_carry_the_rows_as_literals_and_are_deterministic(case: str) -> None:
    """Every production value is a literal the compiler built; the same incident compiles to the same bytes."""
    first, second = (compile_repro(CASES[case]()) for _ in range(2))
    assert first.source == second.source
    data = {n.target.id: ast.literal_eval(n.value) for n in ast.parse(first.source).body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None
            and n.target.id.isupper() and n.target.id not in ("DSN", "TRACE_OUT")}  # fmt: skip
    assert data["ENTITIES"] == list(dict.fromkeys([CASES[case]().entity, *CASES[case]().entities]))
    assert data["CHECK"]["serial"] is True


def test_call_specs_count_the_statements_on_the_incidents_rows() -> None:
    """A phantom's lookup found none of its rows: it is not counted, so the shop's charge spec (written for the
    INSERT of a duplicate apply) takes the INSERT's parameters; counting from the last statement does the same."""
    assert [s.on_rows for s in build(CASES["phantom"]()).steps if s.kind != "commit"] == [False, False, True, True]
    shipped = compile_repro(CASES["phantom"](), level="app", call_specs=CALL_SPECS)
    assert shipped.source.count("'args': [1009, 4200, 'pay-1009']") == 2
    last = {CHARGE: CallSpec("bench.shop.handlers:charge", (Param(-1, 0), Param(-1, 1), Param(-2, 0)))}
    with pytest.raises(ReproError, match="no statement #-2"):
        compile_repro(CASES["phantom"](), level="app", call_specs=last)
    assert all(s.on_rows for s in build(CASES["write_skew"]()).steps)  # the counts read both doctors
