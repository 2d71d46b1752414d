"""``[proof]``: proof contracts and the proof judge (stage 1)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class ProofConfig(Section):
    """Proof contracts and the proof judge (stage 1)."""

    settle_s: float = Field(30.0, ge=0, description="event time to wait for collisions (stage 2) before judging")
    slice_s: float = Field(1.0, gt=0, description="granularity of the judge's event-time slices")
    max_builds: int = Field(16, ge=2, description="builds kept per service")
    max_keys: int = Field(1024, ge=16, description="routes / error kinds / event names kept per build")
    watch_s: float = Field(3600.0, gt=0, description="how long a new build is watched for a verdict")

    max_marks: int = Field(
        1000, ge=1, description="deploy marks kept (trace-repro deploy mark); past it the oldest is forgotten"
    )
    max_fingerprints: int = Field(100_000, ge=16, description="defects whose occurrences and contracts are tracked")
