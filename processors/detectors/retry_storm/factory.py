"""The retry storm detector's factory: stage 1 (``ingest``), configured by ``[retry_storm]``, windows by
``[windows]``."""

from __future__ import annotations

from processors.detectors.retry_storm.config import RetryStormConfig
from processors.detectors.retry_storm.data import FINDING_TYPE
from processors.detectors.retry_storm.detector import RetryStormDetector
from processors.findings.tally_detector import tally_factory

FACTORY = tally_factory(RetryStormDetector, RetryStormConfig, FINDING_TYPE)

__all__ = ["FACTORY"]
