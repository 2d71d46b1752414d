"""N+1 queries: one statement shape run once per item in a loop inside one request (``[n_plus_one]``)."""

from processors.detectors.n_plus_one.config import NPlusOneConfig
from processors.detectors.n_plus_one.data import FINDING_TYPE, TYPE, NPlusOneData
from processors.detectors.n_plus_one.detector import NPlusOneDetector
from processors.detectors.n_plus_one.factory import FACTORY

__all__ = ["FACTORY", "FINDING_TYPE", "TYPE", "NPlusOneConfig", "NPlusOneData", "NPlusOneDetector"]
