"""Latency and error regressions between windows and between deploy versions, with exact tests."""

from processors.detectors.regressions.config import RegressionConfig
from processors.detectors.regressions.detector import DetectorSettings, RegressionDetector, regression_fingerprint
from processors.detectors.regressions.factory import FACTORY, JUDGE, Regressions
from processors.detectors.regressions.judge import RegressionJudge
from processors.detectors.regressions.stats import ServiceStats, StatsWindow

__all__ = [
    "FACTORY",
    "JUDGE",
    "DetectorSettings",
    "RegressionConfig",
    "RegressionDetector",
    "RegressionJudge",
    "Regressions",
    "ServiceStats",
    "StatsWindow",
    "regression_fingerprint",
]
