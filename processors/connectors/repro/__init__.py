"""The repro worker: RED, the repair plan and GREEN for each new defect (a connector: incidents in, repros out)."""

from typing import TYPE_CHECKING

from processors.api.lazy import exports
from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.factory import FACTORY

if TYPE_CHECKING:
    from processors.connectors.repro.worker import ReproWorker

__all__ = ["FACTORY", "ReproConfig", "ReproWorker"]

# The worker (libcst, the compiler, the repair planner) is imported on first use: a daemon without it never loads them.
__getattr__ = exports(__name__, {"processors.connectors.repro.worker": ("ReproWorker",)})
