"""Builds the contention detector from ``[contention]`` and ``[windows]``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.contention.config import ContentionConfig
from processors.detectors.contention.detector import COMPONENT, ContentionDetector
from processors.model.finding import FindingEvent
from processors.state.config import WindowConfig


def create(config: ContentionConfig, ctx: Context) -> ContentionDetector:
    return ContentionDetector(config, ctx.section("windows", WindowConfig), telemetry=ctx.telemetry(COMPONENT),
                              events=ctx.state_events)  # fmt: skip


FACTORY: Factory[ContentionConfig, ContentionDetector] = Factory(
    kind="detector", name=COMPONENT, config=ContentionConfig, create=create, stage="ingest", events=(FindingEvent,),
    enabled=lambda c: c.enabled,
)  # fmt: skip
