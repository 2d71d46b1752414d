"""The N+1 detector's factory: stage 1 (``ingest``), configured by ``[n_plus_one]``, windows by ``[windows]``."""

from __future__ import annotations

from processors.api.component import Context, Factory
from processors.detectors.n_plus_one.config import NPlusOneConfig
from processors.detectors.n_plus_one.data import FINDING_TYPE, TYPE
from processors.detectors.n_plus_one.detector import NPlusOneDetector
from processors.model.finding import FindingEvent, register_type
from processors.model.units import s_to_ns
from processors.state.config import WindowConfig

register_type(FINDING_TYPE)


def create(config: NPlusOneConfig, ctx: Context) -> NPlusOneDetector:
    windows = ctx.section("windows", WindowConfig)
    return NPlusOneDetector(config, s_to_ns(windows.window_s), s_to_ns(windows.trace_gap_s),
                            max_windows=windows.max_windows, telemetry=ctx.telemetry(TYPE),
                            events=ctx.state_events)  # fmt: skip


def _enabled(config: NPlusOneConfig) -> bool:
    return config.enabled


FACTORY: Factory[NPlusOneConfig, NPlusOneDetector] = Factory(
    kind="detector", name=TYPE, config=NPlusOneConfig, create=create, stage="ingest", events=(FindingEvent,),
    enabled=_enabled,
)  # fmt: skip
