"""Repair strategies for code on the Django ORM (the statement is built by a queryset, not written as a string).

The recorded statement (as Django rendered it) is matched to the queryset call that issues it
(:mod:`~processors.repair.django_orm.querysets`, models by table in :mod:`~processors.repair.django_orm.models`), and
that call is edited: :mod:`~processors.repair.django_orm.row_lock` reads through ``select_for_update()``;
:mod:`~processors.repair.django_orm.unique_insert` declares a ``UniqueConstraint`` and turns the losing
``create()``'s ``IntegrityError`` into what the code's own check does; :mod:`~processors.repair.django_orm.isolation`
runs the ``transaction.atomic()`` block at SERIALIZABLE with a bounded retry; and
:mod:`~processors.repair.django_orm.atomic_update` turns ``obj.f += x; obj.save()`` into ``update(f=F("f") + x)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from processors.repair.django_orm.atomic_update import atomic_update
from processors.repair.django_orm.isolation import stricter_isolation
from processors.repair.django_orm.row_lock import row_lock
from processors.repair.django_orm.unique_insert import unique_insert
from processors.repair.strategies.base import (
    ATOMIC_UPDATE,
    ROW_LOCK,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    Outcome,
    Writer,
)

STRATEGIES: Final[dict[str, Callable[[Context, Writer], Outcome]]] = {
    ROW_LOCK: row_lock,
    UNIQUE_INSERT: unique_insert,
    STRICTER_ISOLATION: stricter_isolation,
    ATOMIC_UPDATE: atomic_update,
}
