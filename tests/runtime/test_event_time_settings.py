"""The same collisions, with the same credit, whatever the event-time settings (in process, both stages chained).

Hypothesis explores trace gap, allowed lateness, idle timeout and causal window within their valid ranges, the
batching of the input and how late each batch arrives on the wall clock; every planted lost update must be found
once with the right culprit and victim, every row change credited to the request that made it, nothing found in
the background traffic, and every input position committable at the end.
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.state.config import WindowConfig
from tests.runtime.chain import CDC, CHARGES_CDC, INVENTORY_CDC, MS, SPANS, T0, Chain, Found, S, Scenario


def _scenario(collisions: int, same_value: bool) -> Scenario:
    s = Scenario()
    for i in range(collisions):
        s.lost_update(row=10 + i, at_ns=T0 + i * 20 * S + S, same_value=same_value and i % 2 == 0)
        s.serial_update(row=100 + i, at_ns=T0 + i * 20 * S + 7 * S, value=f"v{i}")  # alone on its row
        s.serial_update(row=10 + i, at_ns=T0 + i * 20 * S + 14 * S, value="later")  # same row, 13 s later
    return s


event_time_settings = st.fixed_dictionaries(
    {
        "TRACE_REPRO_WINDOWS__TRACE_GAP_S": st.sampled_from(["0.2", "1", "3", "10"]),
        "TRACE_REPRO_WINDOWS__ALLOWED_LATENESS_S": st.sampled_from(["0", "0.5", "2", "5"]),
        "TRACE_REPRO_WINDOWS__IDLE_S": st.sampled_from(["0.3", "1", "5"]),
        "TRACE_REPRO_COLLISIONS__WINDOW_S": st.sampled_from(["0.5", "1", "2", "3"]),
        "TRACE_REPRO_COLLISIONS__SETTLE_S": st.sampled_from(["0", "1"]),
    }
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(event_time_settings, st.booleans(), st.randoms(use_true_random=False))
def test_same_collisions_and_credit_with_any_valid_settings(env: dict[str, str], same_value: bool,
                                                            rnd: random.Random) -> None:  # fmt: skip
    """Whatever the settings and the batching, each planted lost update is reported once (culprit = the first
    write, victim = the overwriting one) and every commit is credited to its own writer."""
    scenario = _scenario(3, same_value)
    chain = Chain(env)
    found = chain.run(scenario, rnd)
    got = {(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in found.incidents}
    assert got == scenario.collisions, env
    assert len(found.incidents) == len(scenario.collisions)
    assert all(e["anomaly"] == "lost_update" for e in found.incidents)
    credited = {lsn: found.functions[span] for lsn, span in found.credits.items()}
    assert credited == scenario.credits, (env, found.strengths)
    assert found.dead_letters == 0
    assert chain.committable_everywhere()


def test_default_settings_find_and_credit_the_same() -> None:
    """The shipped defaults (trace gap 10 s, lateness 5 s, idle 5 s, window 2 s) give the same answer."""
    scenario = _scenario(4, same_value=True)
    found = Chain({}).run(scenario, random.Random(7), wall_step_s=0.5)
    assert {(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in found.incidents} == (
        scenario.collisions
    )
    assert {lsn: found.functions[s] for lsn, s in found.credits.items()} == scenario.credits
    assert "commit_order" in found.strengths.values()  # the same-value lost updates needed the commit order
    assert MS > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(
    st.fixed_dictionaries(
        {
            "TRACE_REPRO_WINDOWS__TRACE_GAP_S": st.sampled_from(["0.2", "1", "10"]),
            "TRACE_REPRO_WINDOWS__IDLE_S": st.sampled_from(["0.3", "5"]),
        }
    ),
    st.sampled_from([0.04, 2.5, 6.0]),
    st.sampled_from([0, 2 * S, 5 * S]),
    st.randoms(use_true_random=False),
)
def test_late_row_changes_and_split_traces_find_the_same(env: dict[str, str], cdc_lag_s: float, split_ns: int,
                                                         rnd: random.Random) -> None:  # fmt: skip
    """Debezium lagging past the settle time, and a culprit's read exported seconds before the rest of its trace
    (closed as a fragment, judged with the other trace before its write came): every lost update is still found,
    once, with its culprit and victim (before, a split trace's pair was never judged again: none was found). On the
    shipped window and settle time."""
    scenario = Scenario()
    for i in range(3):
        scenario.lost_update(row=10 + i, at_ns=T0 + i * 40 * S + S, split_ns=split_ns)
        scenario.serial_update(row=100 + i, at_ns=T0 + i * 40 * S + 7 * S, value=f"v{i}")
    chain = Chain(env)
    found = chain.run(scenario, rnd, cdc_lag_s=cdc_lag_s, wall_step_s=0.5, polls=True)
    got = [(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in found.incidents]
    assert sorted(got) == sorted(scenario.collisions), (env, cdc_lag_s, split_ns)
    credited = {lsn: found.functions[span] for lsn, span in found.credits.items()}
    if split_ns:  # a write whose span came after the credit delay: its change stays uncorrelated, never miscredited
        missed = {lsn: fn for lsn, fn in scenario.credits.items() if lsn not in credited}
        assert set(missed.values()) <= {"shop.jobs.expire_cart"}
        assert credited == {lsn: fn for lsn, fn in scenario.credits.items() if lsn not in missed}
    else:
        assert credited == scenario.credits
    assert found.dead_letters == 0
    assert chain.committable_everywhere()


@pytest.mark.parametrize("cdc_lag_s", [0.04, 1.0, 3.0])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_an_oversell_before_debezium_named_the_tables_key_is_found(cdc_lag_s: float, seed: int) -> None:
    """The first checkouts of a table whose key Debezium has not named yet (the seed's row change still on its way)
    are predicate statements; their value-less decrements credit no change. The oversell is still found, as it is
    once the key is known. (CI missed the first of three oversells; before this, these batchings with the seed's
    change 3 s late missed the first one too.)"""
    env = {"TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2", "TRACE_REPRO_WINDOWS__IDLE_S": "0.3",
           "TRACE_REPRO_COLLISIONS__INVARIANTS": json.dumps({"inventory": ["stock >= 0"]})}  # fmt: skip
    scenario = Scenario()
    for i in range(3):
        scenario.oversell(f"sku-{i}", T0 + i * 20 * S + S)
    chain = Chain(env, owners=[((SPANS, 0), (INVENTORY_CDC, 0))])
    found = chain.run(scenario, random.Random(seed), cdc_lag_s=cdc_lag_s, wall_step_s=0.5, polls=True)
    got = sorted((e["entity"], e["anomaly"]) for e in found.incidents)
    assert got == [(f"inventory:sku-{i}", "invariant_violation") for i in range(3)], cdc_lag_s
    assert all("stock = -1 violates stock >= 0" in e["damage"] for e in found.incidents)
    assert found.dead_letters == 0
    assert chain.committable_everywhere()


@pytest.mark.parametrize("cdc_lag_s", [20.0, 50.0])
def test_row_changes_debezium_sent_late_are_credited_on_the_shipped_defaults(cdc_lag_s: float) -> None:
    """Every row change up to ``windows.max_cdc_lag_s`` late is still credited to the request that made it (before,
    writes were forgotten ~14 s after no change on time could be theirs: none of these was credited)."""
    scenario = Scenario()
    for i in range(3):
        scenario.lost_update(row=10 + i, at_ns=T0 + i * 60 * S + S)
        scenario.serial_update(row=100 + i, at_ns=T0 + i * 60 * S + 7 * S, value=f"v{i}")
    chain = Chain({})
    found = chain.run(scenario, random.Random(3), cdc_lag_s=cdc_lag_s, wall_step_s=0.5, polls=True)
    assert {(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in found.incidents} == (
        scenario.collisions
    )
    assert {lsn: found.functions[span] for lsn, span in found.credits.items()} == scenario.credits
    assert chain.committable_everywhere()


def _silent_oversells(cdc_lag_s: float) -> tuple[Found, Chain]:
    """Three oversells where no request fails (only the committed ``stock = -1`` shows it), a minute apart, every
    row change late by ``cdc_lag_s``, on the shipped event-time settings."""
    env = {"TRACE_REPRO_COLLISIONS__INVARIANTS": json.dumps({"inventory": ["stock >= 0"]})}
    scenario = Scenario()
    for i in range(3):
        scenario.oversell(f"sku-{i}", T0 + i * 60 * S + S)
    chain = Chain(env, owners=[((SPANS, 0), (INVENTORY_CDC, 0))])
    assert chain.settings.windows == WindowConfig()
    return chain.run(scenario, random.Random(5), cdc_lag_s=cdc_lag_s, wall_step_s=0.5, polls=True), chain


@pytest.mark.parametrize("cdc_lag_s", [0.04, 10.0, 20.0, 50.0])
def test_silent_oversells_are_found_with_debezium_lagging_on_the_shipped_defaults(cdc_lag_s: float) -> None:
    """Each silent oversell is found once its row change arrives, up to ``windows.max_cdc_lag_s`` (60 s) late.
    (Before, a change more than ~15 s late came after its row's history was pruned: all three were missed, counted
    only as ``late_past_history``.)"""
    found, chain = _silent_oversells(cdc_lag_s)
    got = sorted((e["entity"], e["anomaly"]) for e in found.incidents)
    assert got == [(f"inventory:sku-{i}", "invariant_violation") for i in range(3)], cdc_lag_s
    assert all("stock = -1 violates stock >= 0" in e["damage"] for e in found.incidents)
    assert found.dead_letters == 0
    assert chain.committable_everywhere()


def test_a_row_change_later_than_the_bound_is_counted_not_lost_silently() -> None:
    """Debezium 90 s behind, past ``max_cdc_lag_s``: the changes come after their rows' histories went. They are
    counted (``late_past_history``, on /metrics), and nothing is found or committed short."""
    found, chain = _silent_oversells(90.0)
    assert found.incidents == []
    assert chain.metrics.telemetry("collisions").events["late_past_history"] >= 3
    assert found.dead_letters == 0
    assert chain.committable_everywhere()


@pytest.mark.parametrize("cdc_lag_s", [0.04, 20.0, 50.0])
def test_double_charges_are_found_with_debezium_lagging_on_the_shipped_defaults(cdc_lag_s: float) -> None:
    """Two charge requests that both found no charge and both inserted one (a phantom through inserts, seen only in
    the row images): found once the late changes come, on the shipped settings with nothing configured. The class
    spans rows, so it looks the traces up beyond the rows judged: those stay while their rows wait for changes
    (before, a 20 s lag found none of the three)."""
    scenario = Scenario()
    for i in range(3):
        scenario.double_charge(order=500 + i, at_ns=T0 + i * 60 * S + S)
    chain = Chain({}, owners=[((SPANS, 0), (CDC, 0), (CHARGES_CDC, 0))])
    assert chain.settings.windows == WindowConfig()
    found = chain.run(scenario, random.Random(3), cdc_lag_s=cdc_lag_s, wall_step_s=0.5, polls=True)
    got = {(e["entity"], e["culprit"]["function"], e["victim"]["function"]) for e in found.incidents}
    assert got == scenario.collisions, cdc_lag_s
    assert {e["anomaly"] for e in found.incidents} == {"phantom"} and len(found.incidents) == 3
    assert {lsn: found.functions[span] for lsn, span in found.credits.items()} == scenario.credits
    assert chain.committable_everywhere()
