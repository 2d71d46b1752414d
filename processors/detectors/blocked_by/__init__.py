"""Blocked by: DB statements that waited on a row lock another trace held, named with the holder's code path."""

from processors.detectors.blocked_by.config import BlockedByConfig
from processors.detectors.blocked_by.detector import BlockedByDetector
from processors.detectors.blocked_by.factory import FACTORY
from processors.detectors.blocked_by.model import BLOCKED_BY, BlockedByData

__all__ = ["BLOCKED_BY", "FACTORY", "BlockedByConfig", "BlockedByData", "BlockedByDetector"]
