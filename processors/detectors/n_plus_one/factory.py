"""The N+1 detector's factory: stage 1 (``ingest``), configured by ``[n_plus_one]``, windows by ``[windows]``."""

from __future__ import annotations

from processors.detectors.n_plus_one.config import NPlusOneConfig
from processors.detectors.n_plus_one.data import FINDING_TYPE
from processors.detectors.n_plus_one.detector import NPlusOneDetector
from processors.findings.tally_detector import tally_factory

FACTORY = tally_factory(NPlusOneDetector, NPlusOneConfig, FINDING_TYPE)

__all__ = ["FACTORY"]
