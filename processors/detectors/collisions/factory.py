"""Building the collision detector from ``[collisions]``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.collisions.config import CollisionConfig
from processors.detectors.collisions.detector import CollisionDetector
from processors.lib.invariants import compile_invariants
from processors.model.incident import IncidentEvent
from processors.model.units import ms_to_ns, s_to_ns
from processors.state.config import WindowConfig


def create(config: CollisionConfig, ctx: Context) -> CollisionDetector:
    return CollisionDetector(
        window_ns=s_to_ns(config.window_s),
        settle_ns=s_to_ns(config.settle_s),
        late_ns=s_to_ns(ctx.section("windows", WindowConfig).max_cdc_lag_s),
        invariants=compile_invariants(config.invariants),
        history_per_entity=config.history_per_entity,
        history_per_table=config.history_per_table,
        max_entities=config.max_entities,
        max_traces=config.max_traces,
        max_reported=config.max_reported,
        skew_ns=ms_to_ns(config.skew_ms),
        telemetry=ctx.telemetry("collisions"),
        events=ctx.state_events,
    )


FACTORY: Factory[CollisionConfig, CollisionDetector] = Factory(
    kind="detector", name="collisions", config=CollisionConfig, create=create, stage="entities",
    events=(IncidentEvent,),
)  # fmt: skip
