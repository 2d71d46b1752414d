"""The repro worker: RED, the repair plan and GREEN for each new defect (a connector: incidents in, repros out)."""

from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.worker import FACTORY, ReproWorker

__all__ = ["FACTORY", "ReproConfig", "ReproWorker"]
