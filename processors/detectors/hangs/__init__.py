"""Hangs: hops with no timeout (calls far beyond their hop's recent durations without an error, or timeouts the
callee never answered), as ``hang`` findings."""

from processors.detectors.hangs.config import HangConfig
from processors.detectors.hangs.detector import HangDetector
from processors.detectors.hangs.factory import FACTORY
from processors.detectors.hangs.finding import HANG, HangData, hang_fingerprint

__all__ = ["FACTORY", "HANG", "HangConfig", "HangData", "HangDetector", "hang_fingerprint"]
