"""Building the blocked-by detector from ``[blocked_by]`` (the clock skew is correlation's: ``correlation.skew_ms``)."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.correlation.config import CorrelationConfig
from processors.detectors.blocked_by.config import BlockedByConfig
from processors.detectors.blocked_by.detector import BlockedByDetector
from processors.detectors.blocked_by.model import BLOCKED_BY
from processors.model.finding import FindingEvent, register_type
from processors.model.units import ms_to_ns, s_to_ns

register_type(BLOCKED_BY)


def create(config: BlockedByConfig, ctx: Context) -> BlockedByDetector:
    correlation = ctx.section("correlation", CorrelationConfig)
    return BlockedByDetector(
        min_wait_ns=ms_to_ns(config.min_wait_ms),
        release_ns=ms_to_ns(config.release_ms),
        skew_ns=ms_to_ns(correlation.skew_ms + correlation.clock_jitter_ms),
        window_ns=s_to_ns(config.window_s),
        settle_ns=s_to_ns(config.settle_s),
        max_hold_ns=s_to_ns(config.max_hold_s),
        min_blocked=config.min_blocked,
        history_per_entity=config.history_per_entity,
        max_entities=config.max_entities,
        max_traces=config.max_traces,
        max_pairs=config.max_pairs,
        telemetry=ctx.telemetry("blocked_by"),
        events=ctx.state_events,
    )


FACTORY: Factory[BlockedByConfig, BlockedByDetector] = Factory(
    kind="detector",
    name="blocked_by",
    config=BlockedByConfig,
    create=create,
    stage="entities",
    events=(FindingEvent,),
    enabled=lambda c: c.enabled,
)
