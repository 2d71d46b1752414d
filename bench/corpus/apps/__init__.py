"""The corpus apps, one module per scenario (each module's docstring explains its anomaly in Adya's terms)."""

from __future__ import annotations

from bench.corpus.apps.invariant_violation import InvariantViolation
from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom
from bench.corpus.apps.read_skew import ReadSkew
from bench.corpus.apps.relative_updates import RelativeUpdates
from bench.corpus.apps.write_skew import WriteSkew
from bench.corpus.scenario import Scenario

SCENARIOS: dict[str, Scenario] = {
    s.name: s for s in (LostUpdate(), WriteSkew(), Phantom(), ReadSkew(), InvariantViolation(), RelativeUpdates())
}


def scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}: one of {', '.join(SCENARIOS)}") from None
