"""CPython's GIL switch interval, set for a process whose event loop waits on the engines while a batch runs.

The runner overlaps a batch's CPU work (``Stage.process``, in a worker thread) with the previous batch's writes
(the graph statements and the Kafka produce, on the event loop's thread). Each time a reply comes, the loop's thread
needs the GIL back, and by default waits up to 5 ms for the worker to hand it over. A batch's writes wait on a dozen
replies or more, and they are the loop's critical path: the next batch cannot start before they end. At 1 ms the
loop gets it back sooner. What that did to a batch's writes and to the CPU per span, measured, is in
``bench/RESULTS.md`` (issue 37, eighth session): where the daemon is busy the whole time, the worker thread gets that
time less and the run is no faster; where it waits on the writes, the wait is shorter.

Set once, before the daemon starts (forked workers inherit it).
"""

from __future__ import annotations

import sys

SWITCH_INTERVAL_S = 0.001  # CPython: 0.005


def tune() -> None:
    """Set this process's switch interval (and that of the processes it forks from now on)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
