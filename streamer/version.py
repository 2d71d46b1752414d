"""The installed trace-repro's version (``trace-repro --version``, ``trace_repro_build_info``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trace-repro")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
