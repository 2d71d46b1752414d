"""The anomaly classes trace-repro reports, named once (Adya's phenomena in Elle's vocabulary)."""

from __future__ import annotations

from enum import StrEnum


class Anomaly(StrEnum):
    """What went wrong between independent requests on shared rows, or between builds of a service."""

    LOST_UPDATE = "lost_update"  # G-single (P4): two traces read one version, the second sets a value over the first
    INVARIANT_VIOLATION = "invariant_violation"  # the same stale read, and its damage: a broken invariant, a failure
    DUPLICATE_APPLY = "duplicate_apply"  # one configured identity inserted twice
    WRITE_SKEW = "write_skew"  # G2-item: each read a row the other then changed, each wrote a different row
    PHANTOM = "phantom"  # G2: each read a predicate and inserted a row the other's predicate selects
    READ_SKEW = "read_skew"  # G-single: a reader saw one row before a transaction and another after it
    REGRESSION = "regression"  # an error or latency regression of an operation (not a collision)

    @property
    def label(self) -> str:
        """Human name for issue titles and summaries: ``Lost update``."""
        return self.value.replace("_", " ").capitalize()

    @classmethod
    def collisions(cls) -> tuple[Anomaly, ...]:
        """The classes the collision detector reports."""
        return (cls.LOST_UPDATE, cls.INVARIANT_VIOLATION, cls.DUPLICATE_APPLY, cls.WRITE_SKEW, cls.PHANTOM,
                cls.READ_SKEW)  # fmt: skip


def title(anomaly: str) -> str:
    """The title of a known class, or the raw name of one this build does not know."""
    try:
        return Anomaly(anomaly).label
    except ValueError:
        return anomaly
