"""A small, mergeable latency sketch: log-spaced buckets with bounded relative error.

Values land in bucket ``ceil(log(v) / log(gamma))``; a quantile is read back as the bucket's midpoint, so the
relative error is at most ``(gamma - 1) / 2`` (1% with the default gamma 1.02). The number of buckets is bounded
by the value range (1 µs .. 1 h is ~1,100 buckets at most), not by the number of values.
"""

from __future__ import annotations

import math


class LatencySketch:
    __slots__ = ("_buckets", "_log_gamma", "count", "gamma", "max", "min")

    def __init__(self, gamma: float = 1.02) -> None:
        self.gamma = gamma
        self._log_gamma = math.log(gamma)
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.min = math.inf
        self.max = 0.0

    def add(self, value_ms: float) -> None:
        # Comparisons, not ``min``/``max`` calls: it runs for every request the regression statistics count.
        v = value_ms if value_ms > 1e-3 else 1e-3
        key = math.ceil(math.log(v) / self._log_gamma)
        buckets = self._buckets
        buckets[key] = buckets.get(key, 0) + 1
        self.count += 1
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v

    def merge(self, other: LatencySketch) -> None:
        for key, n in other._buckets.items():
            self._buckets[key] = self._buckets.get(key, 0) + n
        self.count += other.count
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def to_row(self) -> dict[str, object]:
        """Plain data for a graph property set: the buckets as two arrays, the count, min and max."""
        keys = sorted(self._buckets)
        return {"bins": keys, "bin_counts": [self._buckets[k] for k in keys], "n": self.count,
                "min": self.min if self.count else 0.0, "max": self.max}  # fmt: skip

    @classmethod
    def from_row(cls, bins: list[int], counts: list[int], minimum: float, maximum: float,
                 gamma: float = 1.02) -> LatencySketch:  # fmt: skip
        """The sketch :meth:`to_row` wrote (bucket arrays of equal length)."""
        sketch = cls(gamma)
        for key, n in zip(bins, counts, strict=True):
            sketch._buckets[int(key)] = sketch._buckets.get(int(key), 0) + int(n)
            sketch.count += int(n)
        if sketch.count:
            sketch.min, sketch.max = float(minimum), float(maximum)
        return sketch

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1) in milliseconds; 0.0 for an empty sketch."""
        if self.count == 0:
            return 0.0
        rank = q * (self.count - 1)
        seen = 0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen > rank:
                mid = 2 * self.gamma**key / (self.gamma + 1)
                return min(max(mid, self.min), self.max)
        return self.max
