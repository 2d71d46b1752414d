"""What the stacks share: a corpus round's contenders as HTTP requests to a stack's views, and the rounds' driver.

A stack's view handles ``POST <rule>``; the rule's one variable is the round's key (the contender's first argument:
the account, the doctor, the room) and the JSON body is ``{"args": [...]}``, the contender's arguments. The request
goes through the framework in the calling thread (its test client: the same WSGI/ASGI stack, routing, middleware and
stock instrumentation as under a server, without a socket), so the duel's race points (``bench.corpus.race``, a
per-thread hook) reach the view. The view's response carries its trace id in ``X-Trace-Id`` (read from the span the
framework's instrumentation made current), a refusal answers 409 with ``{"error": ...}``.

:func:`run_rounds` plays a stack's rounds with the corpus's own checks (``bench.corpus.runner.run_round``: statuses,
commit order, what the database shows).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry import trace

from bench.corpus.apps.lost_update import LostUpdate
from bench.corpus.apps.phantom import Phantom
from bench.corpus.apps.write_skew import WriteSkew
from bench.corpus.manifest import RoundRecord
from bench.corpus.runner import BETWEEN_S, run_round
from bench.corpus.scenario import RoundPlan, Scenario
from bench.corpus.service import Outcome, Service

TRACE_HEADER = "X-Trace-Id"


@dataclass(frozen=True)
class Reply:
    status: int
    trace_id: str
    body: dict[str, Any]


Send = Callable[[str, dict[str, Any]], Reply]  # (path, JSON body) -> the reply


@dataclass(frozen=True)
class View:
    """A stack's view for one kind of round: its rule (one variable, the round's key) and its function."""

    rule: str
    function: Callable[..., Any]

    @property
    def name(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"

    def path(self, key: object) -> str:
        return re.sub(r"<[^>]+>|\{[^}]+\}", str(key), self.rule, count=1)  # Flask/Django <key>, FastAPI {key}


def current_trace_id() -> str:
    return format(trace.get_current_span().get_span_context().trace_id, "032x")


def restack(plan: RoundPlan, view: View) -> RoundPlan:
    """The corpus round with its two contenders sent to ``view``."""
    leader, follower = (replace(c, handler=view.function, route=view.rule, path=view.path(c.args[0]))
                        for c in (plan.leader, plan.follower))  # fmt: skip
    return replace(plan, leader=leader, follower=follower)


def stack_plans(scenario: Scenario, views: dict[str, View], offset: int, rounds: int = 1) -> list[RoundPlan]:
    """``rounds`` rounds of every kind of ``scenario``, numbered from ``offset + 1``, sent to ``views``."""
    kinds = [k for _ in range(rounds) for k in scenario.kinds]
    return [restack(scenario.plan(kind, offset + i), views[kind]) for i, kind in enumerate(kinds, start=1)]


class StackClient(Service):
    """``Service.request`` as an HTTP request to a stack's view (``send``), answered with the corpus's Outcome."""

    def __init__(self, scenario: str, dsn: str, send: Send, *, schema: str = "public") -> None:
        super().__init__(scenario, dsn, trace.NoOpTracer(), schema=schema)
        self.send = send

    def request(self, route: str, path: str, fn: Callable[..., Any], *args: Any) -> Outcome:
        reply = self.send(path, {"args": list(args)})
        name = View(route, fn).name
        error = "" if reply.status == 200 else str(reply.body.get("error", reply.body))
        return Outcome(name, route, reply.status, reply.trace_id, reply.body if reply.status == 200 else None, error)


# The corpus scenarios every stack runs: the races of its users' code, each with its controls.
STACK_SCENARIOS: tuple[Scenario, ...] = (LostUpdate(), WriteSkew(), Phantom())


def all_plans(views: Mapping[str, dict[str, View]], offset: int) -> list[tuple[Scenario, list[RoundPlan]]]:
    """One round of every kind of every stack scenario (``views``: a stack's views by scenario and kind), numbered
    from the stack's ``offset``."""
    out = []
    for scenario in STACK_SCENARIOS:
        out.append((scenario, stack_plans(scenario, dict(views[scenario.name]), offset)))
        offset += len(scenario.kinds)
    return out


def run_rounds(client: StackClient, scenario: Scenario, plans: Sequence[RoundPlan], *, dsn: str, schema: str,
               log: Callable[[str], None] | None = None) -> list[RoundRecord]:  # fmt: skip
    """Play ``plans`` against the stack (``client``), each round checked as the corpus checks it."""
    records = []
    for i, plan in enumerate(plans):
        if i:
            time.sleep(BETWEEN_S)
        record = run_round(client, scenario, plan, dsn=dsn, schema=schema)
        records.append(record)
        if log is not None:
            statuses = " ".join(f"{r.role}={r.status}" for r in record.requests)
            log(f"{client.scenario} round {plan.number} {plan.kind}: {statuses} rows {', '.join(record.rows)}")
    return records
