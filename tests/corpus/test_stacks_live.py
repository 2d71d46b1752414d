"""The corpus on the stacks people run, live: stock instrumentation with default options, a real Collector, the real
PostgreSQL (READ COMMITTED) and Debezium connector, and the daemon on its shipped configuration.

Each stack (``bench.corpus.stacks``: three Python services in this process, and a Java one in a JVM of its own
with the OpenTelemetry Java agent) plays one round of each bug (lost update, write skew, phantom) and of each of
their controls, with the interleaving forced (``bench.corpus.race``) and the damage checked in PostgreSQL. Its spans
carry no statement parameters and no ``code.*``; they go OTLP -> the Collector (``bench.collector`` on the shipped
``config/otel-collector.yaml``) -> Kafka. The daemon runs with only the engines' addresses, the topic and group
names, the CDC pattern and the HTTP port set (``shipped-config``); ``with-checkout`` adds the code locator's
checkouts, one per service (``bench/corpus/stacks/<stack>``), and nothing else. Every bug round must yield exactly
one incident of its class with the first committer's trace as culprit and the other's as victim, every control none,
and nothing else be reported; the table printed (stack x class: found, control clean, how the accesses were keyed
and the code located) is docs/detection.md's.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from bench.collector.process import StartCollector
from bench.corpus import stacks
from bench.corpus.manifest import RoundRecord
from bench.corpus.runner import drop_schema, prepare
from bench.corpus.scenario import RoundPlan, Scenario
from bench.corpus.stacks import django_orm, fastapi_asyncpg, flask_sqlalchemy, java_jdbc
from bench.corpus.stacks.java_jdbc.app import METHODS as JAVA_METHODS
from bench.corpus.stacks.web import StackClient, run_rounds
from bench.corpus.telemetry import OPT_IN
from streamer import config
from streamer.engines import LocalEngines
from tests.corpus.expectations import belongs, describe, stray_incidents
from tests.corpus.test_corpus_live import JUDGED_AFTER_S, TOPICS
from tests.harness import Harness

pytestmark = pytest.mark.engines

SOURCE_ROOT = Path(stacks.__file__).parent  # each stack's package (bench/corpus/stacks/<stack>) is its checkout
UNSENT = ("code.", "db.statement.parameters", "db.query.parameter.")  # what no stock default sends
STACKS: tuple[ModuleType, ...] = (flask_sqlalchemy, django_orm, fastapi_asyncpg, java_jdbc)


def judge(rnd: RoundRecord, incidents: Sequence[dict[str, Any]]) -> list[str]:
    """A bug round owns exactly one incident of its class, culprit the first committer's trace, victim the other's;
    a control round owns none. (Functions are not compared: no span names its code, and the daemon's code locator
    is opt-in; how each party was located is in the table.)"""
    mine = [i for i in incidents if belongs(i, rnd)]
    if rnd.expected is None:
        return [f"control round {rnd.number} ({rnd.kind}) got {describe(i)}" for i in mine]
    want = rnd.expected
    if len(mine) != 1:
        found = "; ".join(describe(i) for i in mine) or "nothing"
        return [f"bug round {rnd.number} on {rnd.rows}: expected one {want.anomaly} incident, found {found}"]
    [incident] = mine
    got = (incident["anomaly"], incident["culprit"]["trace_id"], incident["victim"]["trace_id"])
    if got != (want.anomaly, want.culprit_trace, want.victim_trace):
        return [f"bug round {rnd.number}: expected {want.anomaly} culprit {want.culprit_trace[:8]} victim "
                f"{want.victim_trace[:8]}, got {describe(incident)}"]  # fmt: skip
    return []


def what_was_sent(messages: Sequence[Any]) -> tuple[dict[str, set[str]], list[str], str]:
    """From the spans topic (what the Collector wrote): each service's span kinds that carry a route or a statement,
    the attributes no stock default sends (statement parameters, ``code.*``), and the messages' shape."""
    kinds: dict[str, set[str]] = {}
    forbidden: list[str] = []
    messages_of: dict[bytes, int] = {}
    most = 0
    for message in messages:
        data = TracesData.FromString(message.value)
        traces = set()
        for rs in data.resource_spans:
            service = next(kv.value.string_value for kv in rs.resource.attributes if kv.key == "service.name")
            for ss in rs.scope_spans:
                for span in ss.spans:
                    traces.add(span.trace_id)
                    keys = {kv.key for kv in span.attributes}
                    if "http.route" in keys:
                        kinds.setdefault(service, set()).add("route")
                    if keys & {"db.statement", "db.query.text"}:
                        kinds.setdefault(service, set()).add("statement")
                    forbidden += [f"{service} {span.name}: {k}" for k in keys if k.startswith(UNSENT)]
        most = max(most, len(traces))
        for t in traces:
            messages_of[t] = messages_of.get(t, 0) + 1
    split = sum(n > 1 for n in messages_of.values())
    shape = (f"{len(messages)} messages, {len(messages_of)} traces, at most {most} trace(s) per message, "
             f"{split} trace(s) split over several messages")  # fmt: skip
    return kinds, forbidden, shape


def how(incident: dict[str, Any]) -> str:
    """How the incident's statements were keyed (``keying`` x ``key_candidates``) and its parties located."""
    parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
    keyed = sorted({f"{p['keying']}" + (f"({p['key_candidates']})" if p["key_candidates"] != 1 else "")
                    for p in parties})  # fmt: skip
    located = sorted({located_as(p) for p in (incident["culprit"], incident["victim"])})
    return f"keyed {'+'.join(keyed)}; code {' / '.join(located)}"


def counters(harness: Harness) -> str:
    """How the run's row changes were credited and its statements keyed (and located), and what was dropped."""
    assert harness.daemon is not None
    out = []
    for family in harness.daemon.metrics.registry.collect():
        for sample in family.samples:
            if not sample.value:
                continue
            if sample.name in ("trace_repro_row_changes_correlated_total", "trace_repro_dropped_total") or (
                sample.name == "trace_repro_component_events_total"
                and sample.labels.get("component") in ("correlation", "keying", "codeloc")
            ):
                out.append(f"{sample.name.removeprefix('trace_repro_')}{sample.labels}={sample.value:g}")
    return ", ".join(out)


def located_as(party: dict[str, Any]) -> str:
    """How a culprit or victim was located: the method, and the function (or its candidates)."""
    if not party["located_by"]:
        return "unlocated"
    found = party["function"] or "one of " + ", ".join(party["candidates"])
    return f"{party['located_by']}: {found}"


def table(runs: dict[str, list[tuple[Scenario, list[RoundRecord]]]], incidents: Sequence[dict[str, Any]]) -> str:
    lines = ["| stack | class | bug found | controls clean | keying; code located |", "|---|---|---|---|---|"]
    for stack, played in runs.items():
        for scenario, records in played:
            bugs = [r for r in records if r.is_bug]
            controls = [r for r in records if not r.is_bug]
            found = sum(not judge(r, incidents) for r in bugs)
            clean = sum(not judge(r, incidents) for r in controls)
            owned = [i for r in bugs for i in incidents if belongs(i, r)]
            lines.append(f"| {stack} | {scenario.name} | {found}/{len(bugs)} | {clean}/{len(controls)} "
                         f"({', '.join(r.kind.removeprefix('control:') for r in controls)}) | "
                         f"{'; '.join(how(i) for i in owned) or '—'} |")  # fmt: skip
    return "\n".join(lines)


CHECKOUTS = {  # [codeloc]: each service's own checkout
    "TRACE_REPRO_CODELOC__SOURCE_ROOT": str(SOURCE_ROOT),
    "TRACE_REPRO_CODELOC__SERVICES": json.dumps({f"corpus-{s.STACK}": s.STACK for s in STACKS}),
}


def issuers(view: str) -> set[str]:
    """The names in the checkout of the functions that may issue a view's statements: the view itself and the
    functions of its module it calls (a helper such as ``_off_call``); for the Java service, the method and the
    methods of its class it calls, as the stack declares them."""
    if view in JAVA_METHODS:
        return JAVA_METHODS[view].issuers
    module_name, _, name = view.rpartition(".")
    module = importlib.import_module(module_name)
    code = inspect.unwrap(getattr(module, name)).__code__
    short = module_name.removeprefix(f"{stacks.__name__}.").split(".", 1)[1]  # its name in its stack's checkout
    called = {n for n in code.co_names if inspect.isfunction(getattr(module, n, None))}
    return {f"{short}.{n}" for n in {name, *called}}


def wrongly_located(rounds: Sequence[RoundRecord], incidents: Sequence[dict[str, Any]]) -> list[str]:
    """Culprits and victims the code locator named a function that did not run their statements (an ambiguous one
    must have such a function among its candidates; an unlocated one names nothing, which is not wrong)."""
    wrong = []
    for rnd in rounds:
        if rnd.expected is None:
            continue
        for incident in (i for i in incidents if belongs(i, rnd)):
            for role, view in (("culprit", rnd.expected.culprit), ("victim", rnd.expected.victim)):
                party, ran = incident[role], issuers(view)
                if party["candidates"]:
                    fine = party["function"] == "" and bool(ran & set(party["candidates"]))
                else:
                    fine = party["function"] in ran | {""}
                if not fine:
                    wrong.append(f"{describe(incident)}: {role} located {party['function'] or party['candidates']}"
                                 f" ({party['located_by']}), ran {sorted(ran)}")  # fmt: skip
    return wrong


@pytest.mark.parametrize("located", [False, True], ids=["shipped-config", "with-checkout"])
async def test_stacks_live(
    engines: LocalEngines,
    kafka_bootstrap: str,
    falkordb_url: str,
    otel_collector: StartCollector,
    monkeypatch: pytest.MonkeyPatch,
    located: bool,
) -> None:
    """Every stack: each bug round found as its class (culprit and victim the right traces), each control clean, no
    stray incident. ``with-checkout`` also gives the code locator (opt-in) each service's checkout (``[codeloc]
    source_root`` and ``services``): every culprit and victim must then be located, to the view that ran (or a
    function of its module it calls)."""
    monkeypatch.delenv(OPT_IN, raising=False)  # the instrumentations' default semantic conventions
    tag = uuid.uuid4().hex[:8]
    prefix = schema = f"stacks_{tag}"
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"stacks_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^{prefix}\.{schema}\.[a-z_]+$",
        **{f"TRACE_REPRO_KAFKA__{t.upper()}_TOPIC": f"{t}-{tag}" for t in TOPICS},
        **(CHECKOUTS if located else {}),
    }
    settings = config.load(None, env=env)
    dsn = engines.address("postgres")
    stack_plans = {stack.STACK: stack.plans() for stack in STACKS}
    by_scenario: dict[str, tuple[Scenario, list[RoundPlan]]] = {}
    for played in stack_plans.values():
        for scenario, plans in played:
            by_scenario.setdefault(scenario.name, (scenario, []))[1].extend(plans)
    tables = sorted({t.name for s, _ in by_scenario.values() for t in s.tables})
    await asyncio.to_thread(prepare, dsn, list(by_scenario.values()), schema=schema)
    harness = Harness(settings, kafka_bootstrap, falkordb_url)
    await harness.create_topics(*(f"{prefix}.{schema}.{t}" for t in tables))
    await asyncio.to_thread(engines.capture, [f"{schema}.{t}" for t in tables], topic_prefix=prefix)
    try:
        await harness.start()
        collector = await asyncio.to_thread(otel_collector, settings.kafka.spans_topic)
        runs: dict[str, list[tuple[Scenario, list[RoundRecord]]]] = {}
        for stack in STACKS:
            running = await asyncio.to_thread(stack.start, dsn, schema, collector.http_endpoint)
            try:
                for scenario, plans in stack_plans[stack.STACK]:
                    client = StackClient(f"{stack.STACK}/{scenario.name}", dsn, running.send, schema=schema)
                    records = await asyncio.to_thread(run_rounds, client, scenario, plans, dsn=dsn, schema=schema,
                                                      log=print)  # fmt: skip
                    runs.setdefault(stack.STACK, []).append((scenario, records))
            finally:
                await asyncio.to_thread(running.shutdown)
        await asyncio.to_thread(collector.stop)  # it drains its batches to Kafka before it exits
        ended_ns = time.time_ns()
        entities = harness.daemon.entities if harness.daemon is not None else None
        assert entities is not None
        await harness.wait_for(lambda: entities.event_time() >= ended_ns + JUDGED_AFTER_S * 1_000_000_000,
                               "stage 2's event time past the traffic", timeout_s=180)  # fmt: skip
        await asyncio.sleep(2)  # the last batch's incidents are produced before its offsets are committed
        messages, sent = await asyncio.gather(
            harness.consume_all(settings.kafka.incidents_topic, expect=10_000, timeout_s=10),
            harness.consume_all(settings.kafka.spans_topic, expect=10_000, timeout_s=10),
        )
        kinds, forbidden, shape = what_was_sent(sent)
        print("spans topic (written by the Collector):", shape)
        assert not forbidden, forbidden  # the stacks ran on their instrumentations' defaults
        assert kinds == {f"corpus-{s.STACK}": {"route", "statement"} for s in STACKS}, kinds
        incidents: list[dict[str, Any]] = [d for m in messages if (d := json.loads(m.value))["kind"] == "incident"]
        for incident in incidents:
            print("incident:", describe(incident), incident["confidence"], how(incident))
        print(table(runs, incidents))
        print("counters:", counters(harness))
        rounds = [r for played in runs.values() for _, records in played for r in records]
        problems = [p for rnd in rounds for p in judge(rnd, incidents)]
        problems += [f"stray incident: {describe(i)}" for i in stray_incidents(rounds, incidents)]
        assert not problems, "\n".join(problems)
        wrong = wrongly_located(rounds, incidents)
        assert not wrong, "\n".join(wrong)
        if located:
            unlocated = [describe(i) for i in incidents if not (i["culprit"]["function"] and i["victim"]["function"])]
            assert not unlocated, unlocated
        for incident in incidents:  # stock defaults: no statement carried a value, no span named its code
            parties = [incident["culprit"], incident["victim"], *incident["accesses"]]
            assert not any(p["params"] for p in parties), describe(incident)
            assert all(p["keying"] != "bound" and p["located_by"] != "code_attributes" for p in parties), describe(
                incident
            )
    finally:
        await harness.stop()
        await asyncio.to_thread(drop_schema, dsn, schema)
