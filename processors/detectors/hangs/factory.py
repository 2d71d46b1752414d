"""Builds the hang detector from ``[hangs]`` and ``[windows]``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.hangs.config import HangConfig
from processors.detectors.hangs.detector import COMPONENT, HangDetector
from processors.model.finding import FindingEvent
from processors.state.config import WindowConfig


def create(config: HangConfig, ctx: Context) -> HangDetector:
    return HangDetector(config, ctx.section("windows", WindowConfig), telemetry=ctx.telemetry(COMPONENT),
                        events=ctx.state_events)  # fmt: skip


FACTORY: Factory[HangConfig, HangDetector] = Factory(
    kind="detector", name=COMPONENT, config=HangConfig, create=create, stage="ingest", events=(FindingEvent,),
    enabled=lambda c: c.enabled,
)  # fmt: skip
