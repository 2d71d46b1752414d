"""The serialized fan-out detector's factory: stage 1 (``ingest``), configured by ``[fanout]`` (windows:
``[windows]``); its findings are of type ``serialized_fanout``."""

from __future__ import annotations

from processors.detectors.fanout.config import FanoutConfig
from processors.detectors.fanout.data import FINDING_TYPE
from processors.detectors.fanout.detector import FanoutDetector
from processors.findings.tally_detector import tally_factory

FACTORY = tally_factory(FanoutDetector, FanoutConfig, FINDING_TYPE)

__all__ = ["FACTORY"]
