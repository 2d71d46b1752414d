"""The ``[correlation]`` section: how row changes are credited to the traces that made them (stage 2)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class CorrelationConfig(Section):
    """Row change ↔ trace correlation (stage 2)."""

    trace_column: str = Field("trace_id", description="row column holding the writer's trace id, if the app has one")
    skew_ms: float = Field(5.0, ge=0, description="tolerated clock skew between database and application")
    clock_jitter_ms: float = Field(
        1.0,
        ge=0,
        description="the clocks of one service's instances differ from one another by at most this: k changes of "
        "several rows tied among k of its writers are credited when one clock offset (within skew_ms) allows exactly "
        "one assignment of them to their writers (processors.correlation.clock_match); 0: one clock per service",
    )
    max_commit_delay_ms: float = Field(
        2000.0,
        gt=0,
        description="a commit follows its statement by at most this; a row change is credited once "
        "event time has passed its commit by this much (every writer that could have made it is known by then)",
    )
    max_tie_wait_ms: float = Field(
        10_000.0,
        ge=0,
        description="a row change tied on values and time among more writers than its row's changes known so far "
        "waits (pinned, holding event time) for the row's other changes, for commit order to decide: until event time "
        "has passed the latest commit its writers could have made plus the credit delay, and at most this long after "
        "it first came due; then it is written uncorrelated (counted tie_wait_expired). 0: never waits",
    )
    history_per_entity: int = Field(64, ge=1, description="recent writes remembered per row")
    history_per_table: int = Field(
        4096, ge=1, description="recent predicate writes remembered per table (statements naming no row by its key)"
    )
    max_entities: int = Field(
        100_000, ge=1, description="rows whose recent writes are remembered (least recently written forgotten)"
    )
    max_pending_changes: int = Field(
        100_000, ge=1, description="row changes waiting to be credited; past it the oldest is written uncorrelated"
    )
    max_history_bytes: int = Field(
        128 << 20,
        ge=1 << 20,
        description="bytes of remembered writes (an access's statement and values, plus a fixed cost): past it the "
        "least recently written rows are forgotten, as at max_entities (counted max_history_bytes, per write)",
    )
    max_pending_bytes: int = Field(
        64 << 20,
        ge=1 << 20,
        description="bytes of row changes waiting to be credited (each its record's wire size): past it the oldest "
        "waiting change is written uncorrelated, as at max_pending_changes (counted max_pending_bytes)",
    )
