"""The retry storm detector's factory: stage 1 (``ingest``), configured by ``[retry_storm]``, windows by
``[windows]``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.retry_storm.config import RetryStormConfig
from processors.detectors.retry_storm.data import FINDING_TYPE, TYPE
from processors.detectors.retry_storm.detector import RetryStormDetector
from processors.model.finding import FindingEvent, register_type
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig

register_type(FINDING_TYPE)


def create(config: RetryStormConfig, ctx: Context) -> RetryStormDetector:
    windows = ctx.section("windows", WindowConfig)
    return RetryStormDetector(config, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                              max_windows=windows.max_windows, telemetry=ctx.telemetry(TYPE),
                              events=ctx.state_events)  # fmt: skip


def _enabled(config: RetryStormConfig) -> bool:
    return config.enabled


FACTORY: Factory[RetryStormConfig, RetryStormDetector] = Factory(
    kind="detector", name=TYPE, config=RetryStormConfig, create=create, stage="ingest", events=(FindingEvent,),
    enabled=_enabled,
)  # fmt: skip
