"""Repair strategies for code on the SQLAlchemy ORM or Core (the statement is built, not written as a string).

Each finds the ORM call that issued the recorded statement (:mod:`~.calls`: in the recorded function or a helper
of its module it calls; the table's model by :mod:`~.models`) and edits it through the plan's
:class:`~processors.repair.patch.Patch`, with the SQL-level form of the repair alongside:
:mod:`~.locks` (``with_for_update``; a locking subquery under an aggregate), :mod:`~.atomic` (``update(M)
.values(attr=M.attr + x)``, guarded by the invariant), :mod:`~.unique`
(``insert(...).on_conflict_do_nothing(...)`` and a ``UniqueConstraint``), :mod:`~.version` (``version_id_col``),
:mod:`~.isolation` (SERIALIZABLE with a bounded retry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from processors.repair.sqlalchemy_orm.atomic import atomic_update
from processors.repair.sqlalchemy_orm.isolation import stricter_isolation
from processors.repair.sqlalchemy_orm.locks import row_lock, share_lock
from processors.repair.sqlalchemy_orm.unique import unique_insert
from processors.repair.sqlalchemy_orm.version import optimistic_version
from processors.repair.strategies.base import (
    ATOMIC_UPDATE,
    OPTIMISTIC_VERSION,
    ROW_LOCK,
    SHARE_LOCK,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    Outcome,
    Writer,
)

STRATEGIES: Final[dict[str, Callable[[Context, Writer], Outcome]]] = {
    ROW_LOCK: row_lock,
    SHARE_LOCK: share_lock,
    UNIQUE_INSERT: unique_insert,
    OPTIMISTIC_VERSION: optimistic_version,
    ATOMIC_UPDATE: atomic_update,
    STRICTER_ISOLATION: stricter_isolation,
}
