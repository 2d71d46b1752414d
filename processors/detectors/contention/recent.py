"""An operation's recent (window, concurrency, latency) pairs, with each window's ranks kept between tests.

The test (``fit.rank_correlation``) ranks the pairs within their window and pools the ranks. An operation is tested
at every window close over all its recent pairs (up to ``max_pairs``, from as many windows as fit), but only the
newest window and the oldest (when the bound cut some of its pairs) changed since the last test: their ranks are
computed again, the others' are kept. ``correlation()`` is ``rank_correlation(list(pairs))``, bit for bit (the same
ranks pooled in the same order); the ranks kept are two floats per pair held, so they follow the pairs' bound.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence

from processors.detectors.contention.fit import Ranked, correlate, window_ranks

Pair = tuple[int, int, float]  # (window index, concurrency at start, latency ms)


class RecentPairs:
    """At most ``max_pairs`` pairs, the oldest going first; each window's pairs come at once, in window order."""

    __slots__ = ("_counts", "_pairs", "_ranked")

    def __init__(self, max_pairs: int) -> None:
        self._pairs: deque[Pair] = deque(maxlen=max_pairs)
        self._counts: dict[int, int] = {}  # window index -> its pairs held, the oldest window first
        self._ranked: dict[int, Ranked] = {}  # window index -> its ranks, while its pairs are unchanged

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[Pair]:
        return iter(self._pairs)

    def __repr__(self) -> str:
        return f"RecentPairs({list(self._pairs)!r}, max_pairs={self._pairs.maxlen})"

    def extend(self, window: int, pairs: Sequence[Pair]) -> None:
        """Window ``window``'s pairs (each ``(window, concurrency, latency)``); the oldest pairs past the bound go."""
        counts = self._counts
        if counts and window <= next(reversed(counts)):  # each window's pairs contiguous, for its kept ranks
            raise ValueError(f"window {window} after window {next(reversed(counts))}")
        held = self._pairs
        maxlen = held.maxlen or 0
        over = len(held) + len(pairs) - maxlen  # pairs the bound pushes out, the oldest windows' first
        held.extend(pairs)
        for old in list(counts):
            if over <= 0:
                break
            n = counts[old]
            self._ranked.pop(old, None)
            if n > over:
                counts[old] = n - over
                break
            del counts[old]
            over -= n
        if pairs:
            counts[window] = min(len(pairs), maxlen)

    def correlation(self) -> tuple[float, float, int]:
        """(rho, one-sided p, windows): ``rank_correlation`` of the pairs held."""
        return correlate(self._windows_ranked(), len(self._counts))

    def _windows_ranked(self) -> Iterator[Ranked]:
        ranked, start = self._ranked, 0
        for window, n in self._counts.items():
            if window not in ranked:
                group = [(c, ms) for _, c, ms in itertools.islice(self._pairs, start, start + n)]
                ranked[window] = window_ranks(group)
            yield ranked[window]
            start += n
