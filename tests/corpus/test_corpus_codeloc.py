"""The corpus with ``code.*`` stripped from every span, as auto-instrumentation sends it: with the corpus's source
checkout configured (``[codeloc] source_root``), incidents still name the right handlers and say how they were
located; where two handlers issue the very same statements, the incident names both as candidates and neither as
fact.

The corpus's services add ``code.function.name`` (``corpus.<scenario>.<function>``), ``code.file.path`` and
``code.line.number`` by hand (``bench/corpus/service.py``); here they are removed from the recorded OTLP messages
before the replay. With ``bench/corpus/apps`` as the checkout, a handler's module-qualified name is
``<scenario>.<function>``: the manifest's expectation without its ``corpus.`` prefix.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from processors.model.outputs import IncidentEvent
from processors.repair import plan_repairs
from processors.repro.derive import derive_call_specs
from tests.corpus.expectations import judge_round, stray_incidents
from tests.corpus.replay import Fixture, Replayed, recorded_scenarios, replay

APPS = Path(__file__).resolve().parents[2] / "bench" / "corpus" / "apps"
LOCATED = {"lost_update": "statement", "phantom": "statement", "read_skew": "statement",
           "invariant_violation": "statement"}  # the culprit's method  # fmt: skip
VICTIM_BY_STACK = ("read_skew", "invariant_violation")  # the victim failed: its stack trace names its handler


def _stripped(fixture: Fixture) -> Fixture:
    """The fixture with every ``code.*`` span attribute removed from its OTLP messages."""
    messages = []
    for m in fixture.messages:
        if m.topic == fixture.manifest.spans_topic and m.value:
            data = TracesData.FromString(m.value)
            for rs in data.resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        kept = [kv for kv in span.attributes if not kv.key.startswith("code.")]
                        del span.attributes[:]
                        span.attributes.extend(kept)
            m = replace(m, value=data.SerializeToString())
        messages.append(m)
    return Fixture(fixture.manifest, messages)


@functools.cache
def _replayed(scenario: str, located: bool) -> Replayed:
    env = {"TRACE_REPRO_CODELOC__SOURCE_ROOT": str(APPS)} if located else {}
    return replay(_stripped(Fixture.load(scenario)), env=env)


def _as_recorded(incident: dict[str, Any]) -> dict[str, Any]:
    """The incident with its located names written the way the corpus's code.* named them (``corpus.`` prefix)."""
    out = dict(incident)
    for role in ("culprit", "victim"):
        party = dict(incident[role])
        party["function"] = "corpus." + party["function"] if party["function"] else ""
        out[role] = party
    return out


def test_without_a_checkout_stripped_spans_name_no_function() -> None:
    """The gap: no ``code.*`` and no checkout, every incident's culprit and victim function is empty."""
    incidents = _replayed("lost_update", False).incidents
    assert incidents
    assert {(i["culprit"]["function"], i["victim"]["function"]) for i in incidents} == {("", "")}
    assert {i["culprit"]["located_by"] for i in incidents} == {""}


@pytest.mark.parametrize("scenario", sorted(LOCATED))
def test_stripped_spans_still_name_the_handlers_with_how_they_were_located(scenario: str) -> None:
    """Every round judged as with ``code.*`` (class, culprit and victim handlers and traces, controls clean, no
    stray incident); each party says how its code was found, and its file is the scenario's module."""
    result = _replayed(scenario, True)
    incidents = [_as_recorded(i) for i in result.incidents]
    fixture = Fixture.load(scenario)
    for rnd in fixture.manifest.rounds:
        problems = judge_round(rnd, incidents)
        assert not problems, "\n".join(problems)
    assert not stray_incidents(fixture.manifest.rounds, incidents)
    assert result.incidents
    for incident in result.incidents:
        culprit, victim = incident["culprit"], incident["victim"]
        assert culprit["located_by"] == LOCATED[scenario]
        assert victim["located_by"] == ("stacktrace" if scenario in VICTIM_BY_STACK else LOCATED[scenario])
        for party in (culprit, victim):
            assert party["file"] == str(APPS / f"{scenario}.py") and party["line"] > 0 and party["candidates"] == []


def test_two_handlers_issuing_the_same_statements_are_candidates_never_a_guess() -> None:
    """write_skew's ``go_off_call`` and ``go_off_call_serializable`` send the very same SQL (they differ in
    isolation level only): each incident names both as candidates, and no function, file or line."""
    incidents = _replayed("write_skew", True).incidents
    assert incidents
    for incident in incidents:
        for role in ("culprit", "victim"):
            party = incident[role]
            assert (party["function"], party["file"], party["line"], party["located_by"]) == ("", "", 0, "statement")
            assert party["candidates"] == ["write_skew.go_off_call", "write_skew.go_off_call_serializable"]


def test_repairs_and_app_level_repros_read_the_located_code() -> None:
    """The repair planner finds the located writer in the checkout and says how it was located; an ambiguous one is
    a note naming its candidates; the app-level repro derivation says what it lacks, not that no code is known."""
    lost = IncidentEvent.model_validate(_replayed("lost_update", True).incidents[0])
    plan = plan_repairs(lost, root=APPS)
    assert [(r.function, r.file, r.located_by) for r in plan.repairs] == [("lost_update.deposit", "lost_update.py",
                                                                           "statement")]  # fmt: skip
    assert derive_call_specs(lost, source_root=APPS).reasons == {
        "lost_update.deposit": "deposit(): no recorded value for its parameter 'amount' (no statement of the session "
        "on the incident's rows compares or stores a column of that name, nor <table>.id as <table>_id; a call spec in "
        "[repro] call_specs can supply it)"
    }
    skew = IncidentEvent.model_validate(_replayed("write_skew", True).incidents[0])
    why = ("code not located to one function (statement: 2 candidates: write_skew.go_off_call, "
           "write_skew.go_off_call_serializable)")  # fmt: skip
    assert plan_repairs(skew, root=APPS).notes == [f"(unknown function): {why}"]
    assert set(derive_call_specs(skew, source_root=APPS).reasons.values()) == {why}


@pytest.mark.parametrize("scenario", recorded_scenarios())
def test_no_access_is_located_to_a_wrong_function(scenario: str) -> None:
    """Every access of the stripped corpus is located to the function its ``code.*`` named, or is ambiguous with that
    function among its candidates: a location is never a wrong guess."""
    truth = {a.span_id: a.function.removeprefix("corpus.") for a in replay(Fixture.load(scenario)).accesses}
    located = _replayed(scenario, True).accesses
    assert located and {a.span_id for a in located} == set(truth)
    for a in located:
        if a.candidates:
            assert (a.function, truth[a.span_id] in a.candidates) == ("", True), a
        else:
            assert (a.function, a.located_by in ("statement", "stacktrace")) == (truth[a.span_id], True), a
