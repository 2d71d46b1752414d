"""Conformance over the components registry: every hook of every registered stage component, made to raise in turn.

For each detector and stage connector in ``streamer.components.FACTORIES`` and each processor hook its stage calls
(``on_trace``, ``on_log``, ``on_event``, ``on_access``, ``on_commit``, ``on_relay``, ``on_watermark``,
``on_assign``, ``on_revoke``, ``sync``), the hook raises once, before doing anything or after doing its work, while
both stages run a scenario that exercises every hook (spans, row changes, a log record, an incident, statistics
windows relayed to stage 2, a revoked partition). Whatever raised: nothing escapes either stage, the failure is
counted against that component (a relay that raised is dead-lettered, being a record at hand), every input position
becomes committable (offsets advance), and every other component emits exactly what it emits without the fault.
The sinks' hooks, and processors that always raise, are covered on the real engines by ``test_conformance_live``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData

import tests.runtime.chain
from processors.api.component import Factory, Processor
from streamer.components import FACTORIES, Components, default
from streamer.runtime.records import StageOutput
from tests.regressions.builders import access as evidence_access
from tests.regressions.builders import incident
from tests.runtime.chain import CDC, MS, SPANS, T0, Chain, S, Scenario

ENV = {"TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2", "TRACE_REPRO_WINDOWS__IDLE_S": "0.3",
       "TRACE_REPRO_WINDOWS__WINDOW_S": "10"}  # fmt: skip
STAGES = [f for f in FACTORIES if f.kind in ("detector", "connector") and f.stage]
COMMON = ("on_watermark", "on_assign", "on_revoke", "sync")


class Injected(RuntimeError):
    """The fault."""


def hooks(factory: Factory[Any, Any]) -> list[str]:
    """The processor hooks the stage of ``factory`` calls on its processor."""
    if factory.stage == "ingest":
        own = ["on_trace", "on_log", *(["on_event"] if factory.topics else [])]
    else:
        halves = [f for f in STAGES if f.stage == "ingest" and f.config_section == factory.config_section]
        own = ["on_access", "on_commit", *(["on_relay"] if halves else [])]
    return own + list(COMMON)


CASES = [(f.name, hook, when) for f in STAGES for hook in hooks(f) for when in ("before", "after")]


@dataclasses.dataclass
class Fault:
    """Where the fault is, and what became of it."""

    component: str
    hook: str
    when: str  # "before" the hook does its work, or "after" it
    calls: int = 0
    fired: bool = False
    counted_as: str = ""  # the processor's name: its telemetry's

    def arm(self, processor: Processor) -> None:
        self.counted_as = processor.name
        real = getattr(processor, self.hook)
        if self.hook == "sync":

            async def faulty_sync() -> None:
                self.calls += 1
                if not self.fired:
                    self.fired = True
                    if self.when == "after":
                        await real()
                    raise Injected(f"{self.component}.sync")
                await real()

            processor.sync = faulty_sync
            return

        def faulty(*args: Any) -> Any:
            self.calls += 1
            if not self.fired:
                self.fired = True
                if self.when == "after":
                    real(*args)
                raise Injected(f"{self.component}.{self.hook}")
            return real(*args)

        faulty.__name__ = self.hook
        setattr(processor, self.hook, faulty)

    def components(self) -> Components:
        """The default components, with the faulty one's processors armed as they are built."""

        def wrap(factory: Factory[Any, Any]) -> Factory[Any, Any]:
            if factory.name != self.component:
                return factory
            create = factory.create

            def armed(config: Any, ctx: Any) -> Any:
                processor = create(config, ctx)
                if processor is not None:
                    self.arm(processor)
                return processor

            return dataclasses.replace(factory, create=armed)

        every = default()
        return Components(every.decoders, tuple(wrap(f) for f in every.factories))


def scenario() -> Scenario:
    """Two lost updates, serial updates every few seconds: statistics windows of 10 s close and are relayed."""
    s = Scenario()
    s.lost_update(7, T0 + S)
    s.lost_update(9, T0 + 14 * S)
    for n in range(6):
        s.serial_update(100 + n, T0 + (3 + 4 * n) * S, f"v{n}")
    return s


def log_record(at_ns: int) -> bytes:
    logs = LogsData()
    rec = logs.resource_logs.add().scope_logs.add().log_records.add(time_unix_nano=at_ns)
    rec.body.string_value = "checkout done"
    rec.trace_id = bytes.fromhex("7a" * 16)
    return logs.SerializeToString()


@dataclasses.dataclass
class Emitted:
    """What each component emitted over a run (events by kind, statistics rows, relays)."""

    events: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    stats: int = 0
    relays: int = 0

    def take(self, out: StageOutput) -> None:
        for event in [*out.events, *out.graph.records]:  # (by what they are about: the trace ids are random)
            self.events.setdefault(event.kind, []).append(getattr(event, "fingerprint", ""))
        self.stats += len(out.graph.stats)


def run(fault: Fault | None, monkeypatch: pytest.MonkeyPatch) -> tuple[Chain, Emitted]:
    """The scenario through both stages, with ``fault`` armed (or none)."""
    with monkeypatch.context() as m:
        if fault is not None:
            m.setattr(tests.runtime.chain, "default", fault.components)
        chain = Chain(ENV, owners=[((SPANS, 0), (CDC, 0))])
    k = chain.settings.kafka
    emitted = Emitted()
    for stage in (chain.ingest, chain.entities):
        process = stage.process

        def recording(records: Any, process: Callable[[Any], StageOutput] = process) -> StageOutput:
            out = process(records)
            emitted.take(out)
            emitted.relays += sum(1 for msg in out.produce if msg.topic == k.accesses_topic and b'"relay"' in
                                  (msg.value or b""))  # fmt: skip
            return out

        stage.process = recording  # type: ignore[method-assign]
    chain.ingest.assign([(k.logs_topic, 0), (k.incidents_topic, 0)])
    chain.entities.assign([(k.accesses_topic, 0), (k.accesses_topic, 1)])
    event = incident(evidence_access("1.0", "f", "/r", at_ms=T0 / MS), evidence_access("1.0", "g", "/r", at_ms=T0 / MS))
    chain._step([chain._record(k.logs_topic, 0, None, log_record(T0)),
                 chain._record(k.incidents_topic, 0, None, event.model_dump_json().encode())])  # fmt: skip
    for stage in (chain.ingest, chain.entities):
        asyncio.run(stage.sync())
    chain.run(scenario(), random.Random(1), wall_step_s=0.5, polls=True)
    return chain, emitted


def outputs_of(emitted: Emitted, component: str) -> Iterator[Any]:
    """What ``component`` contributes to ``emitted``: its events, and the regression statistics and relays."""
    kinds = {"collisions": ("incident",), "regression_judge": ("regression",), "proof": ("contract", "verdict")}
    for kind in kinds.get(component, ()):
        yield kind, sorted(emitted.events.get(kind, []))
    if component == "regressions":
        yield "stats", emitted.stats
        yield "relays", emitted.relays


@pytest.fixture(scope="module")
def baseline() -> Emitted:
    with pytest.MonkeyPatch.context() as m:
        chain, emitted = run(None, m)
    assert chain.committable_everywhere()
    assert emitted.events.get("incident") and emitted.stats and emitted.relays  # the scenario exercises them
    return emitted


@pytest.mark.parametrize(("component", "hook", "when"), CASES)
def test_a_hook_that_raises_costs_its_component_that_call_only(
    component: str, hook: str, when: str, baseline: Emitted, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``component.hook`` raises once: nothing escapes, it is counted against the component, every position is
    committable, and every other component emits what it emits without the fault."""
    fault = Fault(component, hook, when)
    chain, emitted = run(fault, monkeypatch)
    assert chain.committable_everywhere()
    k = chain.settings.kafka
    chain.ingest.forget((k.logs_topic, 0))  # a partition of each stage revoked (on_revoke)
    chain.entities.forget((k.accesses_topic, 1))
    assert fault.fired, f"{component}.{hook} was never called"
    # (a relay is a record at hand: the one that raised is dead-lettered, naming the component)
    reason = {"sync": "sync_error", "on_relay": "internal_error:Injected"}.get(hook, "error")
    assert chain.metrics.telemetry(fault.counted_as).dropped.get(reason) == 1
    for other in {f.name for f in STAGES} - {component}:
        assert dict(outputs_of(emitted, other)) == dict(outputs_of(baseline, other)), other


def test_every_registered_stage_component_is_covered() -> None:
    """The cases come from the registry: a component added to it is tested without editing this file."""
    assert {name for name, _, _ in CASES} == {f.name for f in STAGES} and len(STAGES) >= 4
    assert json.dumps(sorted({hook for _, hook, _ in CASES})) == json.dumps(
        sorted(["on_trace", "on_log", "on_event", "on_access", "on_commit", "on_relay", *COMMON])
    )
