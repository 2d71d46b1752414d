"""The corpus's incidents planned and compiled, without engines: the repair plan of each, made with every code site
the graph would hold (the scenario's control paths included), repairs only the buggy path; a control round compiles
to a schedule the replay can follow (a request whose write waited commits after the one it waited for) and whose
lost-update check knows a relative write keeps what it runs on.
"""

from __future__ import annotations

import pytest

from processors.repair import plan_repairs
from processors.repair.classify import relative_only
from processors.repro import ReproError
from processors.repro.statements import shape, to_psycopg
from tests.corpus.repros import (
    BUGS,
    REPO,
    compile_control,
    first_bug,
    recorded_root,
    site_infos,
)

# Per bug scenario: the functions repaired (with the strategy), and what the plan says of the other paths.
PLANS = {
    "lost_update": (
        [("corpus.lost_update.deposit", "row_lock")],
        ["corpus.lost_update.deposit_atomic: its writes of corpus_accounts are relative (UPDATE corpus_accounts SET "
         "balance = balance + %s WHERE account_no = %s): each keeps a concurrent change, not a party to lost_update",
         "corpus.lost_update.deposit_locked: reads corpus_accounts under a lock (for_update) before it writes: "
         "already protected"],
    ),
    "write_skew": (
        [("corpus.write_skew.go_off_call", "row_lock")],
        ["corpus.write_skew.go_off_call_locked: reads corpus_doctors under a lock (for_update) before it writes: "
         "already protected",
         "corpus.write_skew.go_off_call_serializable: runs its transaction at SERIALIZABLE: already protected"],
    ),
    "phantom": ([("corpus.phantom.book", "unique_insert")], []),
    "read_skew": ([("corpus.read_skew.audit", "share_lock")], []),
    "invariant_violation": ([("corpus.invariant_violation.buy", "atomic_update")], []),
}  # fmt: skip


@pytest.mark.parametrize("scenario", BUGS)
def test_the_plan_repairs_only_the_unprotected_path(scenario: str) -> None:
    """The controls' code paths on the same table are left alone, each with the reason: a relative write (never a
    lost update), a read under FOR UPDATE, a transaction at SERIALIZABLE."""
    _, incident = first_bug(scenario)
    plan = plan_repairs(incident, root=REPO, sites=site_infos(scenario, incident.table), invariants={},
                        source_map={recorded_root(scenario): REPO})  # fmt: skip
    repaired, said = PLANS[scenario]
    assert [(r.function, r.strategy) for r in plan.repairs] == repaired
    assert all(note in plan.notes for note in said), plan.notes
    assert {f.path for f in plan.files} == {f"bench/corpus/apps/{scenario}.py"}


@pytest.mark.parametrize(
    ("statement", "only", "columns"),
    [
        ("UPDATE corpus_accounts SET balance = balance + %s WHERE account_no = %s", True, ["balance"]),
        ("UPDATE t SET qty = qty - 1, sold = sold + 1 WHERE item = %s RETURNING qty", True, ["qty", "sold"]),
        ("UPDATE corpus_accounts SET balance = %s WHERE account_no = %s", False, []),
        ("UPDATE t SET status = %s, version = version + 1 WHERE id = %s RETURNING version", False, ["version"]),
        ("UPDATE t SET total = price * 2 WHERE id = %s", False, []),
    ],
)
def test_a_relative_write_sets_a_column_from_its_own_value(statement: str, only: bool, columns: list[str]) -> None:
    """For the planner, a writer whose writes set every column relatively is no party to a lost update; for the
    repro, the relative columns of each write (a lost update's check keeps the values a relative write ran on)."""
    assert relative_only(statement) is only
    table = statement.split()[1]
    assert shape(to_psycopg(statement, [1] * statement.count("%s")), table).relative == columns


def test_a_relative_write_is_marked_in_the_lost_update_check() -> None:
    """Two deposits with ``balance = balance + %s`` (the lost update's atomic control): the check knows both."""
    _, test = compile_control("lost_update", "control:atomic_update")
    writes = [s.index for s in test.schedule.steps if s.kind == "write"]
    first, second = writes
    assert f"'relative': {{{first}: ['balance'], {second}: ['balance']}}" in test.source


@pytest.mark.parametrize(("scenario", "kind"), [("phantom", "control:unique_on_conflict"),
                                                ("invariant_violation", "control:conditional_update")])  # fmt: skip
def test_a_request_whose_write_waited_commits_after_the_one_it_waited_for(scenario: str, kind: str) -> None:
    """The follower's guarded write (``ON CONFLICT DO NOTHING``, ``AND qty >= 1``) started while the leader's write
    was uncommitted, waited for it and changed nothing: its (empty) transaction ends after the leader's commit."""
    rnd, test = compile_control(scenario, kind)
    leader = next(r.trace_id for r in rnd.requests if r.role == "leader")
    number = {s.trace_id: s.number for s in test.schedule.sessions}
    steps = [(s.session, s.kind, s.rows) for s in test.schedule.steps if s.kind != "read"]
    first, second = number[leader], 3 - number[leader]
    assert steps[-2:] == [(first, "commit", None), (second, "commit", None)]
    assert [rows for session, kind, rows in steps if kind != "commit"] == [1, None]


def test_the_write_skew_controls_cannot_be_compiled() -> None:
    """The doctor who stays on call is a row no request changed: no row image names or seeds it."""
    for kind in ("control:for_update", "control:serializable_retry"):
        with pytest.raises(ReproError, match="cannot tell which column holds the key"):
            compile_control("write_skew", kind)
