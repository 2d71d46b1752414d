"""A statement's *shape*: what its text says, parameter-free (table, operation, lock mode, which placeholder feeds
which key, column or predicate), computed once per statement text by ``processors.sql.access`` and cached."""

from __future__ import annotations

from dataclasses import dataclass, field

from processors.model.events import DbOperation, LockMode, scope_key
from processors.sql.binding import Term
from processors.sql.predicate import Node, Refs
from processors.sql.syntax import Key, Ref


@dataclass(frozen=True, slots=True)
class Target:
    """One row a statement touches."""

    key: tuple[Key, ...]
    labels: tuple[str, ...]  # () → plain key; else identity columns (entity "t:col=v|...")
    set_values: tuple[tuple[str, Ref], ...]


@dataclass(frozen=True, slots=True)
class Shape:
    """A statement's parameter-free reading: the rows it names (``targets``) or, for a predicate access, its WHERE."""

    table: str
    schema: str
    operation: DbOperation
    lock: LockMode
    targets: tuple[Target, ...]  # () for a predicate access
    predicates: tuple[Term, ...]
    keys_version: int = 0  # the table keys this shape was computed with
    keyed: bool = True
    exact: bool = True  # every WHERE term is in ``predicates``
    set_values: tuple[tuple[str, Ref], ...] = ()  # of a predicate access (UPDATE ... SET, INSERT VALUES)
    arity: int = 0  # positional parameters the statement takes (its highest $n): an executemany batch's row size
    rows: int = 1  # rows an unkeyed INSERT makes (set_values are the first's); 0: not known from the text (UNNEST)
    # Of a predicate access: its whole WHERE compiled (``processors.sql.predicate``), and why parts are undecidable
    where: tuple[Node, Refs] | None = None
    undecidable: tuple[str, ...] = ()
    # What every access of it carries, read once: the columns its WHERE compares, bound or not (the key's too), the
    # columns a predicate access of it sets, and a predicate access's entity key
    filters: tuple[str, ...] = ()
    set_columns: tuple[str, ...] = ()
    scope: str = field(init=False, default="")  # the entity key of its predicate accesses: ``scope_key(table)``

    def __post_init__(self) -> None:
        object.__setattr__(self, "scope", scope_key(self.table))  # (frozen: set once, as it is made)
