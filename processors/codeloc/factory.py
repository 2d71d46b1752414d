"""Builds the code locator from its ``[codeloc]`` section (and the ``[repro]`` checkout when it names none)."""

from __future__ import annotations

from pathlib import Path

from processors.codeloc.config import CodeLocConfig
from processors.codeloc.locator import CodeLocator
from processors.telemetry import Telemetry


def build_locator(config: CodeLocConfig, telemetry: Telemetry, *, fallback_root: str = "") -> CodeLocator | None:
    """The locator of ``config.source_root`` (else ``fallback_root``: the repro worker's checkout); None when no
    checkout is configured (accesses then carry only what ``code.*`` says). The checkouts are read here, at start,
    not on the stage's first trace."""
    root = config.source_root or fallback_root
    if not root:
        return None
    locator = CodeLocator(config, Path(root), telemetry)
    locator.prepare()
    return locator
