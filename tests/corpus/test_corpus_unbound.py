"""The anomaly corpus as stock instrumentation sends it: every recorded span's statement parameters taken out.

OpenTelemetry's psycopg/psycopg2/dbapi instrumentations record no parameters by default (the corpus records them
with ``capture_parameters=True``); the daemon must find the same races from the SQL's shape and Debezium's row
changes: every bug round found with its class, culprit and victim, every control clean (``FOR UPDATE``, the atomic
update, ``SERIALIZABLE`` with retry, the unique constraint are read from lock modes and errors, which need no
parameters). How the conflicting statements were keyed is recorded on the incidents (``keying``) and counted.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest

from tests.corpus.expectations import describe, judge_round, stray_incidents
from tests.corpus.replay import Fixture, Replayed, recorded_scenarios, replay
from tests.corpus.unbound import unbound

SCENARIOS = recorded_scenarios()


@functools.cache
def replayed(scenario: str, seed: int = 0) -> tuple[Fixture, Replayed]:
    fixture = unbound(Fixture.load(scenario))
    return fixture, replay(fixture, seed=seed)


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_round_without_parameters(scenario: str, seed: int) -> None:
    """Bug rounds found (class, culprit, victim), controls clean, nothing else reported, with no parameter on any
    span (two batchings of the same messages)."""
    fixture, out = replayed(scenario, seed)
    assert out.accesses and not any(a.params for a in out.accesses)
    problems = [p for rnd in fixture.manifest.rounds for p in judge_round(rnd, out.incidents)]
    problems += [f"stray: {describe(i)}" for i in stray_incidents(fixture.manifest.rounds, out.incidents)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_incidents_say_what_is_inferred(scenario: str) -> None:
    """Every incident names how each statement was keyed and how sure; none claims a bound key it did not have."""
    _, out = replayed(scenario)
    for incident in out.incidents:
        parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
        assert all(p["keying"] != "bound" for p in parties), describe(incident)
        assert any(line.startswith(("inferred", "undecided")) for line in incident["evidence"])
        assert 0 < incident["confidence"] <= min(p["key_confidence"] for p in parties)


def keying_table() -> dict[str, Counter[str]]:
    """How the statements of each scenario's incidents were keyed (the corpus's share of inferred and ambiguous
    keys; ``python -m tests.corpus.test_corpus_unbound`` prints it)."""
    table: dict[str, Counter[str]] = {}
    for scenario in SCENARIOS:
        _, out = replayed(scenario)
        counts: Counter[str] = Counter()
        for incident in out.incidents:
            for p in {
                p["span_id"]: p for p in (incident["culprit"], incident["victim"], *incident["accesses"])
            }.values():
                counts[p["keying"] + (f" (k={p['key_candidates']})" if p["key_candidates"] > 1 else "")] += 1
            counts.update(f"credit {c['correlation']}" for c in incident["commits"])
        table[scenario] = counts
    return table


if __name__ == "__main__":
    for name, counts in keying_table().items():
        print(name, dict(sorted(counts.items())))
