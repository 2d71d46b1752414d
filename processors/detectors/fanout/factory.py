"""The serialized fan-out detector's factory: stage 1 (``ingest``), configured by ``[fanout]`` (windows:
``[windows]``); its findings are of type ``serialized_fanout``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.fanout.config import FanoutConfig
from processors.detectors.fanout.data import FINDING_TYPE
from processors.detectors.fanout.detector import COMPONENT, FanoutDetector
from processors.model.finding import FindingEvent, register_type
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig

register_type(FINDING_TYPE)


def create(config: FanoutConfig, ctx: Context) -> FanoutDetector:
    windows = ctx.section("windows", WindowConfig)
    return FanoutDetector(config, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                          max_windows=windows.max_windows, telemetry=ctx.telemetry(COMPONENT),
                          events=ctx.state_events)  # fmt: skip


def _enabled(config: FanoutConfig) -> bool:
    return config.enabled


FACTORY: Factory[FanoutConfig, FanoutDetector] = Factory(
    kind="detector", name=COMPONENT, config=FanoutConfig, create=create, stage="ingest", events=(FindingEvent,),
    enabled=_enabled,
)  # fmt: skip
