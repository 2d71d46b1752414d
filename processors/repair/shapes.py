"""Each strategy in every code shape: the statement written as a string (``sql``), else built by an ORM.

The planner tries a strategy's raw-SQL form first (the recorded statement is found in the code), then each ORM's
form in this order; the first that applies repairs the writer. When none applies, the reasons of all are the note.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from processors.repair import django_orm, sqlalchemy_orm
from processors.repair.strategies import STRATEGIES, Context, NotApplicable, Outcome, Writer
from processors.repair.strategies.base import NotThisShape

Strategy = Callable[[Context, Writer], Outcome]

SHAPES: Final[tuple[tuple[str, Mapping[str, Strategy]], ...]] = (
    ("sql", STRATEGIES),
    ("sqlalchemy", sqlalchemy_orm.STRATEGIES),
    ("django", django_orm.STRATEGIES),
)


def known(strategy: str) -> bool:
    """Whether some shape implements ``strategy``."""
    return any(strategy in table for _, table in SHAPES)


def repair(ctx: Context, strategy: str, w: Writer) -> Outcome:
    """The writer repaired by ``strategy`` in the first shape it applies to (:class:`NotApplicable` with every
    shape's reason when none does, leaving out the shapes the code is not written in when another has a reason;
    one shape's reason as it is)."""
    reasons: list[tuple[str, str]] = []
    foreign: list[tuple[str, str]] = []  # shapes the code is not written in
    for shape, table in SHAPES:
        fn = table.get(strategy)
        if fn is None:
            continue
        try:
            return fn(ctx, w)
        except NotThisShape as exc:
            foreign.append((shape, str(exc)))
        except NotApplicable as exc:
            reasons.append((shape, str(exc)))
    reasons = reasons or foreign
    if len(reasons) == 1:
        raise NotApplicable(reasons[0][1])
    raise NotApplicable("; ".join(f"{shape}: {why}" for shape, why in reasons))
