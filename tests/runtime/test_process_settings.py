"""The process-wide settings ``trace-repro run`` makes before the daemon starts: the garbage collector's thresholds
(``streamer.runtime.collector``) and the GIL's switch interval (``streamer.runtime.gil``), in one process or under
the supervisor (whose forked workers inherit them)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from streamer import daemon
from streamer.runtime import app, collector, gil, workers

CPYTHON_THRESHOLDS = (700, 10, 10)
CPYTHON_INTERVAL_S = 0.005


@pytest.fixture
def cpython_defaults() -> Iterator[None]:
    """Start from CPython's defaults; put back what the test process had."""
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(*CPYTHON_THRESHOLDS)
    sys.setswitchinterval(CPYTHON_INTERVAL_S)
    yield
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(interval)


@pytest.mark.parametrize(("workers_n", "entry"), [(1, "serve"), (2, "supervise")])
def test_the_daemon_runs_under_the_tuned_process_settings(
    cpython_defaults: None, monkeypatch: pytest.MonkeyPatch, workers_n: int, entry: str
) -> None:
    """``trace-repro run`` sets both before it serves (one process) or supervises (forked workers)."""
    seen: list[tuple[str, tuple[int, ...], float]] = []

    def record(name: str) -> int:
        seen.append((name, gc.get_threshold(), sys.getswitchinterval()))
        return 0

    monkeypatch.setattr(app, "serve", lambda *_: record("serve"))
    monkeypatch.setattr(workers, "supervise", lambda *_: record("supervise"))
    assert collector.THRESHOLDS != CPYTHON_THRESHOLDS and gil.SWITCH_INTERVAL_S != CPYTHON_INTERVAL_S
    assert daemon.run(None, workers=workers_n) == 0
    assert [(name, thresholds) for name, thresholds, _ in seen] == [(entry, collector.THRESHOLDS)]
    assert seen[0][2] == pytest.approx(gil.SWITCH_INTERVAL_S)
