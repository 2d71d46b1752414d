"""The anomaly corpus, replayed through both stages in process with the daemon's default configuration.

Each fixture is the exact Kafka messages (OTLP spans, Debezium row changes) that a corpus scenario produced on the
real engines (``python -m bench.corpus record``); its manifest says, round by round, what detection must report:
one incident of the expected class with the expected culprit and victim for a bug round, none for a control. No
detection setting is configured (no key columns: the tables are keyed by natural keys, not ``id``; no insert
identity; no invariants): the daemon must find the anomalies from what is on the wire.
"""

from __future__ import annotations

import functools

import pytest

from tests.corpus.expectations import describe, judge_round, stray_incidents
from tests.corpus.replay import Fixture, Replayed, recorded_scenarios, replay

SCENARIOS = recorded_scenarios()
ROUNDS = [(name, rnd.number, rnd.kind) for name in SCENARIOS for rnd in Fixture.load(name).manifest.rounds]


@functools.cache
def fixture(scenario: str) -> Fixture:
    return Fixture.load(scenario)


@functools.cache
def replayed(scenario: str, seed: int = 0) -> Replayed:
    return replay(fixture(scenario), seed=seed)


def test_every_scenario_is_recorded() -> None:
    assert SCENARIOS == ["lost_update", "write_skew", "phantom", "read_skew", "invariant_violation",
                         "relative_updates"]  # fmt: skip
    for name in SCENARIOS:
        kinds = [r.kind for r in fixture(name).manifest.rounds]
        assert len(kinds) >= 3 and all(kinds.count(k) == kinds.count(kinds[0]) for k in kinds), kinds


@pytest.mark.parametrize(("scenario", "number", "kind"), ROUNDS, ids=[f"{s}-{n}-{k}" for s, n, k in ROUNDS])
def test_round(scenario: str, number: int, kind: str) -> None:
    """A bug round yields exactly one incident of its class, culprit = first committer, victim = the other one;
    a control round yields none."""
    rnd = fixture(scenario).round(number)
    assert rnd.kind == kind
    problems = judge_round(rnd, replayed(scenario).incidents)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_incident_outside_the_bug_rounds(scenario: str) -> None:
    strays = stray_incidents(fixture(scenario).manifest.rounds, replayed(scenario).incidents)
    assert not strays, "\n".join(describe(i) for i in strays)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_replay_reaches_both_stages(scenario: str) -> None:
    """The machinery: every request's DB spans become stage-1 accesses, every recorded row change reaches stage 2
    and is written, and nothing is dead-lettered."""
    f, result = fixture(scenario), replayed(scenario)
    requests = {r.trace_id for rnd in f.manifest.rounds for r in rnd.requests}
    assert requests <= {a.trace_id for a in result.accesses}, "traces without accesses"
    services = {a.service for a in result.accesses}
    assert services == {f.manifest.service}
    functions = {a.function for a in result.accesses}
    assert functions == {r.function for rnd in f.manifest.rounds for r in rnd.requests}
    recorded = sorted(c.lsn for rnd in f.manifest.rounds for c in rnd.changes)
    assert sorted(c["lsn"] for c in result.changes) == recorded
    assert result.dead_letters == []


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_no_input_stays_pinned_once_everything_is_judged(scenario: str) -> None:
    assert replayed(scenario).committable


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_row_change_is_credited_to_the_request_that_committed_it(scenario: str) -> None:
    """Never to another request; in bug rounds always. A control's change may stay uncorrelated when two statements
    fit it equally well (a lock waiter whose guarded UPDATE matched no row ends right after the commit it waited
    for): ambiguity is counted, never guessed."""
    credits = replayed(scenario).credits()
    wrong = {
        (c.entity, c.lsn): (credits.get(c.lsn, "uncredited"), c.writer)
        for rnd in fixture(scenario).manifest.rounds
        for c in rnd.changes
        if credits.get(c.lsn) != c.writer and (rnd.kind == "bug" or c.lsn in credits)
    }
    assert not wrong, f"(entity, lsn): (credited to, committed by): {wrong}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_batching_does_not_change_what_is_found(scenario: str) -> None:
    """Two other random batchings (and arrival lags) find the same occurrences under the same fingerprints."""

    def found(seed: int) -> list[tuple[str, str, str, str]]:
        return sorted((i["fingerprint"], i["occurrence"], i["anomaly"], i["entity"])
                      for i in replayed(scenario, seed).incidents)  # fmt: skip

    assert found(1) == found(2) == found(0)
