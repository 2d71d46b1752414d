"""The first-divergence check: hand-edited executions are caught at the right index with the right class, and a
repro compiled from a reordered schedule is caught by a real run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from processors.repro import ExecutedStatement, compile_repro, first_divergence, load_trace, lock_waits, run_repro
from tests.repro.cases import incident

PRODUCTION = compile_repro(incident("lost_update")).production_sequence


def _actual() -> list[ExecutedStatement]:
    """What a faithful run records (production's sequence, as the harness writes it)."""
    return [replace(s, values=list(s.values) if s.values else None) for s in PRODUCTION]


def test_the_production_sequence_is_reads_writes_and_commits_in_time_order() -> None:
    """Production's lost update: both reads, the job's write and commit, then capture's write and commit."""
    assert [(s.session, s.statement.split()[0], s.rows) for s in PRODUCTION] == [
        (1, "SELECT", 1), (2, "SELECT", 1), (1, "UPDATE", 1), (1, "COMMIT", None), (2, "UPDATE", 1),
        (2, "COMMIT", None),
    ]  # fmt: skip
    assert PRODUCTION[4].values == [2] and PRODUCTION[1].values == ["pending", 0, 4200]


def test_an_identical_run_is_faithful() -> None:
    """No mismatch at all: the repro is faithful."""
    info = first_divergence(PRODUCTION, _actual())
    assert info.faithful and info.index is None and info.mismatch is None


def test_two_statements_swapped_are_an_ordering_mismatch_at_the_first_of_them() -> None:
    """The job's write run before capture's read is caught at index 1 as ``ordering``."""
    actual = _actual()
    actual[1], actual[2] = actual[2], actual[1]
    info = first_divergence(PRODUCTION, actual)
    assert (info.faithful, info.index, info.mismatch) == (False, 1, "ordering")
    assert info.expected is not None and info.expected.startswith("session 2: SELECT status")
    assert info.actual is not None and info.actual.startswith("session 1: UPDATE orders SET status")


def test_a_statement_that_never_ran_is_missing() -> None:
    """Capture's UPDATE dropped from the run is ``missing`` at its index."""
    actual = _actual()
    del actual[4]
    info = first_divergence(PRODUCTION, actual)
    assert (info.index, info.mismatch) == (4, "missing")


def test_a_run_that_stopped_early_is_missing_at_the_end() -> None:
    """A run that ends before capture commits is ``missing`` where it ended."""
    info = first_divergence(PRODUCTION, _actual()[:5])
    assert (info.index, info.mismatch, info.actual) == (5, "missing", None)


def test_other_rows_affected_are_different_rows() -> None:
    """The job's UPDATE affecting no row is ``different_rows`` at index 2."""
    actual = _actual()
    actual[2] = replace(actual[2], rows=0, values=None)
    info = first_divergence(PRODUCTION, actual)
    assert (info.index, info.mismatch) == (2, "different_rows")
    assert info.expected is not None and "1 rows" in info.expected
    assert info.actual is not None and "0 rows" in info.actual


def test_other_values_read_are_different_rows() -> None:
    """Capture reading the cancelled row instead of the pending one is ``different_rows`` at index 1."""
    actual = _actual()
    actual[1] = replace(actual[1], values=["cancelled", 1, 4200])
    assert (first_divergence(PRODUCTION, actual).index, first_divergence(PRODUCTION, actual).mismatch) == (
        1, "different_rows")  # fmt: skip


def test_a_statement_that_failed_is_a_different_outcome() -> None:
    """Capture's UPDATE failing (a serialization error) where production's succeeded is ``different_outcome``."""
    actual = _actual()
    actual[4] = replace(actual[4], outcome="error", rows=None, error="SerializationFailure: could not serialize")
    assert first_divergence(PRODUCTION, actual).mismatch == "different_outcome"


def test_a_repeated_statement_is_extra_and_off_schedule_statements_are_ignored() -> None:
    """A second run of the job's UPDATE is ``extra``; a statement on another table never counts."""
    actual = _actual()
    other = ExecutedStatement(2, "SELECT id FROM charges WHERE order_id = %s", [1000], 0, "ok")
    actual.insert(2, other)
    assert first_divergence(PRODUCTION, actual).faithful
    actual.insert(4, replace(actual[3], step=None))
    info = first_divergence(PRODUCTION, actual)
    assert (info.index, info.mismatch) == (3, "extra")


def test_the_trace_file_round_trips(tmp_path: Path) -> None:
    """The JSON the generated test writes loads back into statements, lock waits included."""
    trace = tmp_path / "trace.json"
    trace.write_text(
        '{"statements": [{"session": 2, "step": 4, "kind": "write", "statement": "UPDATE  t SET a = %s ;",'
        ' "params": [1], "rows": 1, "values": null, "outcome": "ok", "waited_on": 1, "error": ""}], "events": []}'
    )
    (loaded,) = load_trace(trace)
    assert loaded == ExecutedStatement(2, "UPDATE t SET a = %s", [1], 1, "ok", None, 4, 1, "")
    assert lock_waits([loaded]) == ["session 2 waited on a lock held by session 1: UPDATE t SET a = %s"]
    assert load_trace(tmp_path / "absent.json") == []


@pytest.mark.engines
def test_a_generated_test_with_its_schedule_edited_is_caught_by_its_run(postgres_dsn: str, tmp_path: Path) -> None:
    """Two STEPS lines of the generated file swapped by hand: the real run is unfaithful at index 1, ``ordering``."""
    test = compile_repro(incident("lost_update"))
    lines = test.source.splitlines(keepends=True)
    first = lines.index("STEPS: list[dict[str, Any]] = [\n") + 1
    assert "'session': 2, 'kind': 'read'" in lines[first + 1] and "'kind': 'write'" in lines[first + 2]
    lines[first + 1], lines[first + 2] = lines[first + 2], lines[first + 1]  # the job writes before capture reads
    run, executed = run_repro(replace(test, source="".join(lines)), dsn=postgres_dsn, workdir=tmp_path)
    assert run.status == "failed"  # the edited repro still loses the update (capture reads the uncommitted row) ...
    info = first_divergence(test.production_sequence, executed)  # ... but it is not what production did
    assert (info.faithful, info.index, info.mismatch) == (False, 1, "ordering")
    assert [s.session for s in executed] == [1, 1, 2, 1, 2, 2]
