"""The daemon's entry point: load the configuration, then run the runtime until SIGTERM/SIGINT."""

from __future__ import annotations

import sys
from pathlib import Path

from streamer import config


def run(config_path: Path | None, stages: tuple[str, ...] = ("ingest", "entities")) -> int:
    try:
        settings = config.load(config_path)
    except config.ConfigError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2
    from streamer.runtime.app import serve

    return serve(settings, stages)
