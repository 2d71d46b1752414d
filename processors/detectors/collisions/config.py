"""``[collisions]``: the collision detector (stage 2)."""

from __future__ import annotations

from pydantic import Field, field_validator

from processors.api.component import Section
from processors.lib.invariants import InvariantError, compile_invariants


class CollisionConfig(Section):
    """The collision detector (stage 2)."""

    window_s: float = Field(2.0, gt=0, description="causal window: how far apart two traces' statements may be")
    settle_s: float = Field(1.0, ge=0, description="extra event time to wait for row changes before judging")
    skew_ms: float = Field(
        5.0, ge=0, description="clock skew tolerated between commit and span times when ordering reads and commits"
    )
    invariants: dict[str, list[str]] = Field(
        default_factory=dict, description='table -> SQL predicates on after-images, e.g. {inventory = ["stock >= 0"]}'
    )
    history_per_entity: int = Field(256, ge=2, description="accesses and commits remembered per row")
    history_per_table: int = Field(
        4096, ge=2, description="predicate statements remembered per table (those naming no row by its key)"
    )
    max_entities: int = Field(100_000, ge=1, description="rows with a history (least recently used evicted)")
    max_traces: int = Field(200_000, ge=1, description="recent traces whose accesses are kept for write skew")
    max_reported: int = Field(100_000, ge=1, description="pairs of traces remembered as reported (reported once)")

    @field_validator("invariants")
    @classmethod
    def _parses(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        try:
            compile_invariants(value)
        except InvariantError as exc:
            raise ValueError(str(exc)) from exc
        return value
