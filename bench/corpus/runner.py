"""Runs corpus scenarios on PostgreSQL: schema and seed rows, then the rounds, one duel each, with telemetry to Kafka.

:func:`prepare` creates every table of the given scenarios from scratch in one PostgreSQL schema (``DROP`` and
``CREATE``, ``REPLICA IDENTITY FULL`` so that Debezium's before-images carry every column) and inserts the rows the
rounds start from. It runs untraced and *before* Debezium captures the tables (``LocalEngines.capture``), so the
seed rows never appear as row changes: the change topics hold the rounds' commits only.

:func:`run_scenario` starts the scenario's telemetry (service ``corpus-<scenario>``), plays its rounds with
``between_s`` between them, checks each round against its plan (statuses, commit order, what the database shows:
a round that did not go as designed raises :class:`~bench.corpus.scenario.RoundFailed`), and flushes every span to
the spans topic before it returns the rounds' records.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import psycopg
from opentelemetry.instrumentation.utils import suppress_instrumentation

from bench.corpus.manifest import Expected, RequestRecord, RoundRecord
from bench.corpus.race import duel
from bench.corpus.scenario import Contender, RoundFailed, RoundPlan, Scenario, expect
from bench.corpus.service import Outcome, Service
from bench.corpus.telemetry import start_telemetry

BETWEEN_S = 0.35  # between rounds (>= 300 ms)
ROLES = ("leader", "follower")
_SCHEMA_LOCK = 0xC0_2905  # advisory lock: concurrent preparations must not race on DROP/CREATE


@contextmanager
def untraced(dsn: str, schema: str = "public") -> Iterator[psycopg.Connection]:
    """A connection to ``schema`` (committed on success) whose statements never become spans."""
    with suppress_instrumentation(), psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        yield conn


def prepare(dsn: str, runs: Sequence[tuple[Scenario, Sequence[RoundPlan]]], *, schema: str = "public") -> None:
    """Create the scenarios' tables afresh in ``schema`` and seed the rows their rounds start from."""
    if not schema.isidentifier() or schema.lower() != schema:
        raise ValueError(f"schema {schema!r}: lower-case letters, digits and _ only")
    with untraced(dsn, schema) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        for scenario, plans in runs:
            for table in scenario.tables:
                conn.execute(f"DROP TABLE IF EXISTS {table.name}")
                conn.execute(table.ddl)
                conn.execute(f"ALTER TABLE {table.name} REPLICA IDENTITY FULL")
            scenario.seed(conn, plans)


def drop_schema(dsn: str, schema: str) -> None:
    """Remove a schema :func:`prepare` created (a live test's), with its tables."""
    if schema == "public" or not schema.isidentifier():
        raise ValueError(f"refusing to drop schema {schema!r}")
    with untraced(dsn) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def run_scenario(scenario: Scenario, plans: Sequence[RoundPlan], *, dsn: str, kafka_bootstrap: str, spans_topic: str,
                 schema: str = "public", between_s: float = BETWEEN_S, log: Callable[[str], None] | None = None,
                 otlp_endpoint: str | None = None) -> list[RoundRecord]:  # fmt: skip
    """Play ``plans`` with telemetry to ``spans_topic``; every span is on Kafka when this returns, or, with
    ``otlp_endpoint``, accepted by that Collector (which writes it to its topic)."""
    telemetry = start_telemetry(kafka_bootstrap, spans_topic, scenario.service, otlp_endpoint=otlp_endpoint)
    records: list[RoundRecord] = []
    try:
        service = Service(scenario.name, dsn, telemetry.tracer, schema=schema)
        for i, plan in enumerate(plans):
            if i:
                time.sleep(between_s)
            record = run_round(service, scenario, plan, dsn=dsn, schema=schema)
            records.append(record)
            if log is not None:
                statuses = " ".join(f"{r.role}={r.status}" for r in record.requests)
                log(f"{scenario.name} round {plan.number} {plan.kind}: {statuses} rows {', '.join(record.rows)}")
    finally:
        telemetry.shutdown()
    return records


def _call(service: Service, contender: Contender) -> Callable[[], Outcome]:
    return partial(service.request, contender.route, contender.path, contender.handler, *contender.args)


def run_round(service: Service, scenario: Scenario, plan: RoundPlan, *, dsn: str, schema: str) -> RoundRecord:
    """One duel, checked against its plan; see the module docstring."""
    leader, follower, order = duel(_call(service, plan.leader), _call(service, plan.follower), plan.choreography)
    outcomes = (leader, follower)
    got = (leader.status, follower.status)
    expect(got == plan.statuses, plan, f"statuses {got}, expected {plan.statuses} "
           f"(leader: {leader.error or 'ok'}; follower: {follower.error or 'ok'})")  # fmt: skip
    with untraced(dsn, schema) as conn:
        evidence = scenario.inspect(conn, plan, outcomes)
    position = {who: i for i, who in enumerate(order, start=1)}
    requests = [
        RequestRecord(
            role=ROLES[who],
            function=o.function,
            route=o.route,
            trace_id=o.trace_id,
            status=o.status,
            error=o.error,
            commit=position.get(who),
            writes=list(evidence.writes[who]) if who in position else [],
        )
        for who, o in enumerate(outcomes)
    ]
    expected = None
    if plan.expected is not None:
        culprit, victim = (ROLES.index(plan.expected.culprit), ROLES.index(plan.expected.victim))
        if culprit not in position or (victim in position and position[victim] < position[culprit]):
            raise RoundFailed(f"round {plan.number} ({plan.kind}): the culprit did not commit first: order {order}")
        expected = Expected(plan.expected.anomaly, outcomes[culprit].function, outcomes[victim].function,
                            outcomes[culprit].trace_id, outcomes[victim].trace_id)  # fmt: skip
    return RoundRecord(plan.number, plan.kind, list(evidence.rows), requests, expected, evidence.facts)
