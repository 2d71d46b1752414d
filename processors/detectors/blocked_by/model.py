"""The ``blocked_by`` finding type: its data model, its remedy classes and the one lock wait it aggregates."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pydantic import Field

from processors.model.base import Frozen
from processors.model.events import Access, Commit
from processors.model.finding import FindingType

# The remedy classes the evidence can support (``remedy_for``), never a command.
SHORTEN_LOCK_HOLD = "shorten_lock_hold"  # the holder's transaction spans work outside the database
SPEED_UP_HOLDER = "speed_up_holder_statements"  # the hold is the holder's own statements
LOCK_ORDER = "lock_order"  # the two paths wait on each other (each holds what the other wants)
REMEDIES = (SHORTEN_LOCK_HOLD, SPEED_UP_HOLDER, LOCK_ORDER)


class LockWait(Frozen):
    """One lock wait, as an example in a finding's data: who waited on which row, for whom, how long."""

    row: str
    blocked_trace: str
    blocked_span: str
    blocking_trace: str
    blocking_span: str  # the holder's first lock-taking statement on the row
    commit_lsn: int
    wait_ms: float
    hold_ms: float


class BlockedByData(Frozen):
    """What a ``blocked_by`` finding says for machines: the pair, the window and the damage as values."""

    table: str
    blocked_service: str
    blocked_path: str  # code path (function, else route) of the waiting statements
    blocked_routes: list[str] = Field(default_factory=list)
    blocking_service: str
    blocking_path: str  # code path of the holder's lock-taking statements
    blocking_routes: list[str] = Field(default_factory=list)
    window_start_unix_ms: float
    window_end_unix_ms: float
    blocked: int = Field(ge=1)  # lock waits in the window
    rows: int = Field(ge=1)  # distinct rows they waited on
    total_wait_ms: float
    max_wait_ms: float
    median_wait_ms: float
    max_hold_ms: float
    median_hold_ms: float
    # The median share of a hold the holder spent outside its own DB statements (work between them, not waits).
    holder_outside_db_share: float = Field(ge=0, le=1)
    both_ways: bool = False  # the blocking path also waited on the blocked one in the window
    examples: list[LockWait] = Field(default_factory=list, max_length=5)


BLOCKED_BY = FindingType(
    name="blocked_by",
    title="Blocked by another request's row lock",
    description=(
        "A DB statement waited on a row lock another trace held: it started while the holder had locked the row "
        "and returned when the holder's transaction committed. Named with both code paths, the waits and how long "
        "the holder kept the lock; aggregated per (blocked, blocking) pair and window."
    ),
    data=BlockedByData,
    remedies=REMEDIES,
    severity="medium",
)


@dataclass(frozen=True, slots=True)
class Block:
    """One judged lock wait: ``blocked`` (statement S) waited on ``row`` for the trace whose first lock-taking
    statement there was ``holder`` and whose ``commit`` released it."""

    row: str
    blocked: Access
    holder: Access
    commit: Commit
    wait_ns: int
    hold_ns: int
    outside_db_share: float  # of the hold, the share the holder spent outside its DB statements


def code_path(access: Access) -> str:
    """The code path people know a statement by: its function, else its request's route, else its statement."""
    return access.function or access.route or access.statement[:80]


def fingerprint(service: str, blocked_path: str, blocking_service: str, blocking_path: str, table: str) -> str:
    """Stable across deploys: the services, both code paths and the table, no version and no row."""
    text = "\x1f".join(("blocked_by", service, blocked_path, blocking_service, blocking_path, table))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def remedy_for(outside_db_share: float, both_ways: bool) -> str:
    """The remedy class the evidence supports: opposite waits point at the lock order; a hold spent mostly outside
    the database at shortening it; else at the holder's own statements."""
    if both_ways:
        return LOCK_ORDER
    return SHORTEN_LOCK_HOLD if outside_db_share >= 0.5 else SPEED_UP_HOLDER
