"""The garbage collector's thresholds (``streamer.runtime.collector``): the daemon runs under them, in one process or
under the supervisor (whose forked workers inherit them)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from streamer import daemon
from streamer.runtime import app, collector, workers

CPYTHON_DEFAULT = (700, 10, 10)


@pytest.fixture
def thresholds() -> Iterator[None]:
    """Start from CPython's defaults; put back what the test process had (the thresholds, and the GIL's switch
    interval, which ``daemon.run`` sets too)."""
    before, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(*CPYTHON_DEFAULT)
    yield
    gc.set_threshold(*before)
    sys.setswitchinterval(interval)


@pytest.mark.parametrize(("workers_n", "entry"), [(1, "serve"), (2, "supervise")])
def test_the_daemon_runs_under_the_tuned_collector(
    thresholds: None, monkeypatch: pytest.MonkeyPatch, workers_n: int, entry: str
) -> None:
    """``trace-repro run`` sets the thresholds before it serves (one process) or supervises (forked workers)."""
    seen: list[tuple[str, tuple[int, ...]]] = []

    def serve(*_: object) -> int:
        seen.append(("serve", gc.get_threshold()))
        return 0

    def supervise(*_: object) -> int:
        seen.append(("supervise", gc.get_threshold()))
        return 0

    monkeypatch.setattr(app, "serve", serve)
    monkeypatch.setattr(workers, "supervise", supervise)
    assert collector.THRESHOLDS != CPYTHON_DEFAULT
    assert daemon.run(None, workers=workers_n) == 0
    assert seen == [(entry, collector.THRESHOLDS)]
