"""Builds the code locator from its ``[codeloc]`` section."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from processors.api.telemetry import Telemetry
from processors.codeloc.config import CodeLocConfig

if TYPE_CHECKING:
    from processors.codeloc.locator import CodeLocator

log = structlog.get_logger("trace_repro")


def build_locator(config: CodeLocConfig, telemetry: Telemetry) -> CodeLocator | None:
    """The locator of ``config.source_root``, its checkouts read now (at start, not on a stage's first trace: a
    location must not depend on when a trace closed, since incident fingerprints name the code); None when no
    checkout is configured (accesses then carry only what ``code.*`` says). Opt-in, not taken from ``[repro]
    source_root``: reading a large checkout with libcst takes a while at every start."""
    if not config.source_root:
        return None
    from processors.codeloc.locator import CodeLocator

    locator = CodeLocator(config, Path(config.source_root), telemetry)
    locator.prepare()
    log.info("codeloc.indexed", source_root=config.source_root, **{k: int(v) for k, v in telemetry.state.items()},
             left_out={k: v for k, v in telemetry.dropped.items() if v})  # fmt: skip
    return locator
