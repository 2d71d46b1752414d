"""Retry storms: one call repeated after errors within a request or across a burst of requests (``[retry_storm]``)."""

from processors.detectors.retry_storm.config import RetryStormConfig
from processors.detectors.retry_storm.data import FINDING_TYPE, TYPE, RetryStormData
from processors.detectors.retry_storm.detector import RetryStormDetector
from processors.detectors.retry_storm.factory import FACTORY

__all__ = ["FACTORY", "FINDING_TYPE", "TYPE", "RetryStormConfig", "RetryStormData", "RetryStormDetector"]
