"""The daemon's entry point: load the configuration, then run the runtime until SIGTERM/SIGINT.

With more than one worker (``--workers N`` or the ``workers`` setting; default 1, "auto" = the cores), stage 1 runs
as N worker processes under a supervisor (:mod:`streamer.runtime.workers`); with one, or with ``--stage entities``
(stage 2 is one instance per daemon), the daemon runs in this process. Either way the garbage collector is set for
the daemon's allocations first (:mod:`streamer.runtime.collector`).

A ``TRACE_REPRO_*`` name that nothing reads is warned about at start, with the closest valid name, not refused: the
prefix is shared with the tools' own variables (MCP, engines, CI) and with those of other versions of the daemon in
the same environment, so refusing would stop a daemon over a name it never needed; ``trace-repro config check``
refuses it (exit status 2), for a deployment's CI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from streamer import config, config_names
from streamer.runtime import collector


def run(config_path: Path | None, stages: tuple[str, ...] = ("ingest", "entities"),
        workers: int | str | None = None) -> int:  # fmt: skip
    """Run the daemon; ``workers`` (an int or "auto") overrides the ``workers`` setting."""
    collector.tune()
    try:
        settings = config.load(config_path)
    except config.ConfigError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2
    for name, near in config_names.unknown_env(os.environ, type(settings)):
        hint = f"; did you mean {near}?" if near else ""
        print(f"trace-repro: warning: {name} is not a setting, nothing reads it{hint}", file=sys.stderr)
    from streamer.runtime.workers import supervise, worker_count

    n = worker_count(workers, settings)
    if n > 1 and "ingest" in stages:
        return supervise(settings, config_path, stages, n)
    from streamer.runtime.app import serve

    return serve(settings, stages)
