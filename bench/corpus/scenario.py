"""What a corpus scenario is: its tables, its handlers, and the plan of each round (who races whom, and how).

A *round* is one duel (``bench.corpus.race``) between two requests on rows of their own: the buggy pair (kind
``bug``, with the anomaly it must produce, the culprit and the victim) or a control (kind ``control:<name>``: the
same race on a protected code path, which must produce no anomaly). After the round, the scenario inspects the
database (untraced) and says whether the round went as designed (:class:`Evidence`); a round that did not is an
error of the recording, never a fixture.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import psycopg

from bench.corpus.race import Choreography
from bench.corpus.service import Handler, Outcome

Role = Literal["leader", "follower"]
BUG = "bug"


class RoundFailed(AssertionError):
    """A round did not interleave or end as designed (the anomaly, or its absence, is not what the DB shows)."""


@dataclass(frozen=True)
class Table:
    """A table of a scenario: its DDL (unqualified: created in the schema on the ``search_path``) and its key."""

    name: str
    ddl: str
    key: tuple[str, ...]

    def entity(self, *values: object) -> str:
        """The entity key of a row, as trace-repro names rows: ``<table>:<key values joined by |>``."""
        return f"{self.name}:" + "|".join(str(v) for v in values)


@dataclass(frozen=True)
class Contender:
    """One request of a round: ``POST <route>`` handled by ``handler(conn, *args)``."""

    handler: Handler
    route: str
    path: str
    args: tuple[Any, ...]
    writes: tuple[str, ...] = ()  # the rows it writes when it commits (when known before the round)


@dataclass(frozen=True)
class Expectation:
    """What detection must report for a bug round: the class, and which contender is culprit and which victim."""

    anomaly: str
    culprit: Role
    victim: Role


@dataclass(frozen=True)
class RoundPlan:
    kind: str  # "bug" or "control:<name>"
    number: int  # 1-based, unique in the scenario: the rows of the round are named after it
    rows: tuple[str, ...]  # the rows the round is about (inserted rows are known only afterwards: see Evidence)
    leader: Contender
    follower: Contender
    choreography: Choreography
    statuses: tuple[int, int]  # what the leader and the follower must answer
    expected: Expectation | None = None

    @property
    def is_bug(self) -> bool:
        return self.kind == BUG


@dataclass(frozen=True)
class Evidence:
    """What the database shows after a round: its rows, what each contender wrote, and scenario facts."""

    rows: tuple[str, ...]
    writes: tuple[tuple[str, ...], tuple[str, ...]]  # (leader's rows, follower's rows) if they committed
    facts: dict[str, Any] = field(default_factory=dict)


class Scenario(ABC):
    """A corpus scenario; see the module docstring. Subclasses are the apps in ``bench.corpus.apps``."""

    name: ClassVar[str]
    tables: ClassVar[tuple[Table, ...]]
    kinds: ClassVar[tuple[str, ...]]  # "bug" (if the scenario has one) and its controls, "control:<name>"

    @property
    def service(self) -> str:
        return f"corpus-{self.name}"

    @property
    def schema_sql(self) -> str:
        """The scenario's tables as one SQL script (each table's DDL, in order), e.g. a scratch database's schema."""
        return "".join(f"{table.ddl};\n" for table in self.tables)

    def plans(self, rounds: int) -> list[RoundPlan]:
        """``rounds`` rounds of every kind, interleaved (bug, controls, bug, controls, ...), numbered from 1."""
        kinds = [k for _ in range(rounds) for k in self.kinds]
        return [self.plan(kind, number) for number, kind in enumerate(kinds, start=1)]

    @abstractmethod
    def plan(self, kind: str, number: int) -> RoundPlan:
        """The round ``number`` of ``kind``."""

    @abstractmethod
    def seed(self, conn: psycopg.Connection, plans: Sequence[RoundPlan]) -> None:
        """Insert the rows the rounds start from (untraced, before capture starts)."""

    @abstractmethod
    def inspect(self, conn: psycopg.Connection, plan: RoundPlan, outcomes: tuple[Outcome, Outcome]) -> Evidence:
        """The round's evidence; raises :class:`RoundFailed` when the database does not show what was designed."""


def expect(condition: bool, plan: RoundPlan, what: str) -> None:
    """Raise :class:`RoundFailed` naming the round unless ``condition``."""
    if not condition:
        raise RoundFailed(f"round {plan.number} ({plan.kind}): {what}")
