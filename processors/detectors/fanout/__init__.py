"""Serialized fan-out: N calls to one dependency in one request that run k at a time (``[fanout]``)."""

from processors.detectors.fanout.config import FanoutConfig
from processors.detectors.fanout.data import FINDING_TYPE, TYPE, FanoutData
from processors.detectors.fanout.detector import FanoutDetector
from processors.detectors.fanout.factory import FACTORY

__all__ = ["FACTORY", "FINDING_TYPE", "TYPE", "FanoutConfig", "FanoutData", "FanoutDetector"]
