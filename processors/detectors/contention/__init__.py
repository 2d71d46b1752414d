"""Contention: operations whose latency rises with their own in-flight concurrency (a lock, a pool), as
``contention`` findings with the fitted slope."""

from processors.detectors.contention.config import ContentionConfig
from processors.detectors.contention.detector import ContentionDetector
from processors.detectors.contention.factory import FACTORY
from processors.detectors.contention.finding import CONTENTION, ContentionData, contention_fingerprint

__all__ = [
    "CONTENTION",
    "FACTORY",
    "ContentionConfig",
    "ContentionData",
    "ContentionDetector",
    "contention_fingerprint",
]
