"""Components: what the daemon is built from, each a folder with its config, factory and telemetry.

Like the OpenTelemetry Collector's component model: a :class:`Factory` names a component, declares its config
section (a frozen pydantic model, validated at start, every error naming its key) and builds the component from
that section and a :class:`Context` (the daemon's shared services). The daemon builds itself from one list of
factories (``streamer.components``); adding a detector or a sink is one folder and one line in that list.

Kinds:

``decoder``
    Kafka message value -> typed events (``streamer.decode``), bound to topics by config.
``detector``
    A :class:`Processor` inside a stage that finds something (collisions, regressions) and publishes events.
``connector``
    Consumes one pipeline and produces into another: a :class:`Processor` fed by a stage and by the events of
    the output topics it names in ``Factory.topics`` (the proof desk), or a sink-shaped component fed from
    output topics by a consumer group of its own that publishes events in turn (the repro worker).
``sink``
    A destination of published events (``sinks.base.Sink``); with ``Factory.topics`` it consumes those output
    topics as a consumer group of its own, so a slow destination never holds detection back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, SecretStr

from processors.api.provenance import StateEvents
from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.events import Access, Commit, LogRecord, Relay
from processors.model.graph import GraphBatch
from processors.model.trace import ClosedTrace

Kind = Literal["decoder", "detector", "connector", "sink"]
Stage = Literal["ingest", "entities", ""]
C = TypeVar("C", bound=BaseModel)
T = TypeVar("T")


class Section(BaseModel):
    """Base of every config section: frozen, unknown keys rejected (a typo fails at start, naming the key)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


Publish = Callable[[Published], Awaitable[None]]  # publish one event on its topic, acknowledged on return


class GraphQueries(Protocol):
    """The named graph queries components may run (the graph sink implements them; no Cypher outside it)."""

    async def repro_known(self, fingerprint: str) -> bool:
        """Whether a repro of ``fingerprint`` is recorded already."""

    async def table_sites(self, table: str) -> list[tuple[str, str, str, str, str]]:
        """Every code site that touched ``table``: (function, file, statement, lock, service)."""

    async def record_repro(self, event: Published) -> list[tuple[str, str, str]]:
        """Record a ReproEvent and its Repairs; returns each repaired function's (function, lock before, after)."""

    async def tallies_since(self, updated_ms: float) -> list[dict[str, Any]]:
        """The proof judge's per-partition contributions written at or after ``updated_ms`` (wall clock)."""

    async def table_keys(self) -> list[tuple[str, list[str]]]:
        """Every table's key columns learned so far: (table, columns)."""


class Context(Protocol):
    """What a factory may use besides its own section."""

    @property
    def clock(self) -> Callable[[], int]:
        """Wall clock in ns (injected; only watermark idleness and bookkeeping may read it)."""

    @property
    def state_events(self) -> StateEvents:
        """Where the component's keyed state reports retained/released keys (its stage's offset pins)."""

    def section(self, name: str, model: type[C]) -> C:
        """Another config section (``windows``, ``collisions``, ...), checked to be of ``model``."""

    def telemetry(self, component: str) -> Telemetry:
        """The telemetry exported on /metrics under ``component``."""

    def secret(self, name: str) -> SecretStr | None:
        """A secret setting (``gitlab_token``, ``postgres_dsn``), never logged."""

    @property
    def graph(self) -> GraphQueries | None:
        """The graph, through its named queries (None where there is none: in-process stages, tests)."""

    @property
    def publish(self) -> Publish:
        """Publish an event on the output topic of its kind (sink-shaped connectors)."""


@dataclass(frozen=True, slots=True)
class Quarantined:
    """One unit of a processor's state (a row being judged, a window being closed) whose handling raised: the
    processor dropped it and went on with the others. ``what`` names it for the log (``"row orders:7"``), ``error``
    is what it raised, and ``held`` names the keyed state that held its input (``(store, key)`` pairs), so that the
    runtime can log which input offsets it came from (the processor may already have released them)."""

    what: str
    error: Exception
    held: tuple[tuple[str, Hashable], ...] = ()


@dataclass
class Emit:
    """What processors hand the runtime at a watermark: events to publish, graph rows to write, (stage 1) relays
    to the stage-2 processor of the same component, and the units of state they had to quarantine (the runtime
    counts and logs them; see :class:`Quarantined`)."""

    events: list[Published] = field(default_factory=list)
    graph: GraphBatch = field(default_factory=GraphBatch)
    relays: list[Relay] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)


class Processor:
    """A detector or connector inside a stage: event-time hooks, each a no-op unless overridden.

    Hooks run on the stage's thread, one batch at a time; nothing here may block on I/O. State lives in
    ``processors.state`` stores built with ``Context.state_events``, so that the runtime knows which input the
    processor still holds.
    """

    name: str = "processor"

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        """(ingest) A closed trace and the row accesses its DB spans made."""

    def on_log(self, record: LogRecord, part: str) -> None:
        """(ingest) One OTLP log record, from input partition ``part`` (``"otlp_logs/0"``)."""

    def on_event(self, event: Published, part: str) -> None:
        """An event from an output topic the factory subscribed to (``Factory.topics``), from partition ``part``."""

    def on_access(self, access: Access, part: str = "") -> None:
        """(entities) A read or write of one row by a closed trace, from internal partition ``part`` (what a later
        ``on_revoke`` of that partition takes back)."""

    def on_commit(self, entity: str, commit: Commit, part: str = "") -> None:
        """(entities) A committed row change, with the access that made it when correlation found it, from internal
        partition ``part``."""

    def on_relay(self, relay: Relay, part: str) -> None:
        """(entities) A relay of this component's stage-1 processor (``relay.component == self.name``), from internal
        partition ``part``; raises ``ValueError`` when its body does not validate (the record is dead-lettered)."""

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        """Event time reached ``watermark_ns`` (no open trace started before ``open_since_ns``): emit.

        A processor that handles many units of state here (rows, windows) guards each one: a unit whose handling
        raises is dropped with its state (releasing the input it held) and reported in ``out.quarantined``, and
        the others are still handled and emitted. An exception that escapes the hook is counted against the
        processor and loses whatever the hook had not handled yet."""

    def on_revoke(self, part: str) -> None:
        """Input partition ``part`` (``"otlp_spans/3"``) went to another instance: drop what it contributed to
        state that is not emitted yet (its new owner replays it)."""

    def on_assign(self, part: str) -> None:
        """Input partition ``part`` came to this instance (before any of its input is processed)."""

    async def sync(self) -> None:
        """Between batches, off the hot path: read what other instances wrote (e.g. their counts on the graph)."""


def _always(_config: Any) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class Factory(Generic[C, T]):
    """How to build one component; see the module docstring."""

    kind: Kind
    name: str  # unique: the config section ``[name]`` (unless ``section`` names another) and the telemetry label
    config: type[C]
    create: Callable[[C, Context], T]
    stage: Stage = ""  # detectors and stage connectors: the stage they run in
    topics: Sequence[str] = ()  # output topic roles it consumes: incidents | repros | verdicts | contracts
    events: Sequence[type[Published]] = ()  # kinds it publishes (registered for every sink)
    enabled: Callable[[C], bool] = _always  # off by config (e.g. a sink without a URL)
    section: str = ""  # the config section when it is another component's (its halves in two stages share one)

    @property
    def config_section(self) -> str:
        return self.section or self.name


__all__ = [
    "Context",
    "Emit",
    "Factory",
    "GraphQueries",
    "Kind",
    "Processor",
    "Publish",
    "Quarantined",
    "Section",
    "Stage",
]
