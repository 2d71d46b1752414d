"""The repair strategies, each applied to one unprotected writer (or reader), by family.

:mod:`~processors.repair.strategies.row_lock` locks the rows the writer reads (``FOR UPDATE``; ``FOR SHARE`` for a
reader);
:mod:`~processors.repair.strategies.guarded_update` guards its UPDATE with the invariant (atomic update) or the
version it read (optimistic), handling the "no row updated" path (:mod:`~processors.repair.strategies.no_row`);
:mod:`~processors.repair.strategies.idempotency` guards its INSERT with the request's key;
:mod:`~processors.repair.strategies.unique_insert` makes its INSERT conflict on what its read looked up (a unique
index, the schema migration, and ``ON CONFLICT ... DO NOTHING``);
:mod:`~processors.repair.strategies.isolation` runs its transaction at SERIALIZABLE (or REPEATABLE READ) with
retries. What they share (the writer, the context, the outcome, :class:`NotApplicable`) is in
:mod:`~processors.repair.strategies.base`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from processors.repair.strategies.base import (
    ATOMIC_UPDATE,
    IDEMPOTENCY_GUARD,
    OPTIMISTIC_VERSION,
    REPEATABLE_READ,
    ROW_LOCK,
    SHARE_LOCK,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    Op,
    Outcome,
    Writer,
)
from processors.repair.strategies.guarded_update import atomic_update, optimistic_version
from processors.repair.strategies.idempotency import idempotency_guard
from processors.repair.strategies.isolation import repeatable_read, runs_serializable, stricter_isolation
from processors.repair.strategies.row_lock import row_lock, share_lock
from processors.repair.strategies.unique_insert import unique_insert

STRATEGIES: Final[dict[str, Callable[[Context, Writer], Outcome]]] = {
    ROW_LOCK: row_lock,
    SHARE_LOCK: share_lock,
    ATOMIC_UPDATE: atomic_update,
    OPTIMISTIC_VERSION: optimistic_version,
    STRICTER_ISOLATION: stricter_isolation,
    REPEATABLE_READ: repeatable_read,
    IDEMPOTENCY_GUARD: idempotency_guard,
    UNIQUE_INSERT: unique_insert,
}

__all__ = [
    "ATOMIC_UPDATE",
    "IDEMPOTENCY_GUARD",
    "OPTIMISTIC_VERSION",
    "REPEATABLE_READ",
    "ROW_LOCK",
    "SHARE_LOCK",
    "STRATEGIES",
    "STRICTER_ISOLATION",
    "UNIQUE_INSERT",
    "Context",
    "NotApplicable",
    "Op",
    "Outcome",
    "Writer",
    "atomic_update",
    "idempotency_guard",
    "optimistic_version",
    "repeatable_read",
    "row_lock",
    "runs_serializable",
    "share_lock",
    "stricter_isolation",
    "unique_insert",
]
