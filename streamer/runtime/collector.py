"""CPython's cyclic garbage collector, set for a process that allocates millions of short-lived objects.

By default CPython collects generation 0 every 700 container allocations (net of deallocations), generation 1 every
10 of those, and everything every 10 of those, when the objects that survived since the last full collection exceed
a quarter of the long-lived ones. The daemon allocates per span and per trace, and its heap grows while traces are
open and stage 2 holds its accesses, so each collection walks objects that are still alive, and finds little to free
(reference counting frees the rest). With ``THRESHOLDS`` the collector runs far less often; what that does to
throughput and memory, measured, is in ``bench/RESULTS.md`` (issue 14's section: the garbage collector's bullet,
``make soak``). What a collection would free waits longer: a cycle of garbage up to 50,000 allocations in generation
0 instead of 700, one that outlived a young collection up to 20 young collections; a full collection still comes
once the objects moved to the oldest generation since the last one are a quarter of those it kept.

Set once, before the daemon starts (forked workers inherit it), and by the bench before its ceilings, so that
every phase runs under the daemon's collector.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 10)  # generation 0, 1, 2 (CPython: 700, 10, 10)


def tune() -> None:
    """Set the collector's thresholds for this process (and the processes it forks from now on)."""
    gc.set_threshold(*THRESHOLDS)
