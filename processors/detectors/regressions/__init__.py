"""Latency and error regressions between windows and between deploy versions, with exact tests."""

from processors.detectors.regressions.config import RegressionConfig
from processors.detectors.regressions.detector import DetectorSettings, RegressionDetector, regression_fingerprint
from processors.detectors.regressions.factory import FACTORY, Regressions
from processors.detectors.regressions.stats import ServiceStats, StatsWindow

__all__ = [
    "FACTORY",
    "DetectorSettings",
    "RegressionConfig",
    "RegressionDetector",
    "Regressions",
    "ServiceStats",
    "StatsWindow",
    "regression_fingerprint",
]
