"""Where the local engines keep their cache (jars, binaries) and their run state (data, logs, PIDs)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Layout:
    """Directories used by the local engines.

    ``cache_dir`` survives between runs (Maven-resolved jars); ``run_dir`` holds one ``up``'s data, logs and
    the state file, and is removed by ``down``. The run dir sits under the system temp dir (not under a
    private home) because PostgreSQL runs as an unprivileged user that must be able to reach it.
    """

    config_dir: Path
    cache_dir: Path
    run_dir: Path

    @property
    def state_file(self) -> Path:
        return self.run_dir / "state.json"

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @classmethod
    def default(cls) -> Layout:
        repo = Path(__file__).resolve().parents[2]
        config = Path(os.environ.get("TRACE_REPRO_CONFIG_DIR", repo / "config"))
        cache = Path(os.environ.get("TRACE_REPRO_CACHE", Path.home() / ".cache" / "trace-repro"))
        run = Path(os.environ.get("TRACE_REPRO_RUN_DIR", Path(tempfile.gettempdir()) / f"trace-repro-{os.getuid()}"))
        return cls(config_dir=config, cache_dir=cache, run_dir=run)
