"""The daemon's entry point: load the configuration, then run the runtime until SIGTERM/SIGINT.

With more than one worker (``--workers N`` or the ``workers`` setting; default 1, "auto" = the cores), stage 1 runs
as N worker processes under a supervisor (:mod:`streamer.runtime.workers`); with one, or with ``--stage entities``
(stage 2 is one instance per daemon), the daemon runs in this process. Either way the garbage collector is set for
the daemon's allocations first (:mod:`streamer.runtime.collector`).

A ``TRACE_REPRO_*`` name that nothing reads (a typo: the setting it meant keeps its default) stops the daemon at
start (exit status 2), each such name printed with the closest valid one, as ``trace-repro config check`` reports
it. The tools' own variables (MCP, local engines, CI, bench, tests) are known names, not typos. A deployment that
shares the prefix with something else (another version of the daemon with settings this one lacks) sets
``unknown_env = "warn"``: the names are then printed as warnings and the daemon runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from streamer import config, config_names
from streamer.runtime import collector, gil


def run(config_path: Path | None, stages: tuple[str, ...] = ("ingest", "entities"),
        workers: int | str | None = None) -> int:  # fmt: skip
    """Run the daemon; ``workers`` (an int or "auto") overrides the ``workers`` setting."""
    collector.tune()
    gil.tune()
    try:
        settings = config.load(config_path)
    except config.ConfigError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2
    unknown = config_names.unknown_env(os.environ, type(settings))
    level = "warning" if settings.unknown_env == "warn" else "error"
    for name, near in unknown:
        hint = f"; did you mean {near}?" if near else ""
        print(f"trace-repro: {level}: {name} is not a setting, nothing reads it{hint}", file=sys.stderr)
    if unknown and settings.unknown_env == "refuse":
        print("trace-repro: refusing to start (fix or unset the names above; unknown_env = \"warn\" runs anyway)",
              file=sys.stderr)  # fmt: skip
        return 2
    from streamer.runtime.workers import supervise, worker_count

    n = worker_count(workers, settings)
    if n > 1 and "ingest" in stages:
        return supervise(settings, config_path, stages, n)
    from streamer.runtime.app import serve

    return serve(settings, stages)
