"""The GIL's switch interval (``streamer.runtime.gil``): the daemon runs under it, in one process or under the
supervisor (whose forked workers inherit it)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from streamer import daemon
from streamer.runtime import app, gil, workers

CPYTHON_DEFAULT = 0.005


@pytest.fixture
def interval() -> Iterator[None]:
    """Start from CPython's default; put back what the test process had (the switch interval, and the collector's
    thresholds, which ``daemon.run`` sets too)."""
    before, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(CPYTHON_DEFAULT)
    yield
    sys.setswitchinterval(before)
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize(("workers_n", "entry"), [(1, "serve"), (2, "supervise")])
def test_the_daemon_runs_under_the_tuned_switch_interval(
    interval: None, monkeypatch: pytest.MonkeyPatch, workers_n: int, entry: str
) -> None:
    """``trace-repro run`` sets the interval before it serves (one process) or supervises (forked workers)."""
    seen: list[tuple[str, float]] = []

    def serve(*_: object) -> int:
        seen.append(("serve", sys.getswitchinterval()))
        return 0

    def supervise(*_: object) -> int:
        seen.append(("supervise", sys.getswitchinterval()))
        return 0

    monkeypatch.setattr(app, "serve", serve)
    monkeypatch.setattr(workers, "supervise", supervise)
    assert gil.SWITCH_INTERVAL_S != CPYTHON_DEFAULT
    assert daemon.run(None, workers=workers_n) == 0
    assert seen == [(entry, pytest.approx(gil.SWITCH_INTERVAL_S))]
