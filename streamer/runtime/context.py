"""The :class:`processors.api.component.Context` the runtime gives each factory."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import structlog
from pydantic import BaseModel, SecretStr

from processors.api.component import Factory, GraphQueries, Processor, Publish
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from streamer.config import CoreSettings
from streamer.runtime.metrics import Metrics

C = TypeVar("C", bound=BaseModel)
log = structlog.get_logger("trace_repro")


class RuntimeContext:
    """Shared services for one component: settings, clock, telemetry, its stage's pins, the graph, publishing."""

    def __init__(self, settings: CoreSettings, metrics: Metrics, clock: Callable[[], int], *,
                 graph: GraphQueries | None = None, publish: Publish | None = None,
                 state_events: StateEvents = NO_EVENTS) -> None:  # fmt: skip
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._graph = graph
        self._publish = publish
        self._state_events = state_events

    @property
    def clock(self) -> Callable[[], int]:
        return self._clock

    @property
    def state_events(self) -> StateEvents:
        return self._state_events

    def section(self, name: str, model: type[C]) -> C:
        return self._settings.section(name, model)

    def telemetry(self, component: str) -> Telemetry:
        return self._metrics.telemetry(component)

    def secret(self, name: str) -> SecretStr | None:
        if name == "gitlab_token":
            return self._settings.gitlab_token
        if name == "postgres_dsn":
            return SecretStr(self._settings.postgres_dsn) if self._settings.postgres_dsn else None
        raise KeyError(f"no secret named {name!r}")

    @property
    def graph(self) -> GraphQueries | None:
        """The graph's named queries; None where there is no graph (in-process stages, tests)."""
        return self._graph

    @property
    def publish(self) -> Publish:
        if self._publish is None:
            raise RuntimeError("no publisher in this context (stage processors emit, they do not publish)")
        return self._publish


def create(factory: Factory[Any, Any], ctx: RuntimeContext, settings: CoreSettings) -> Any:
    """The component, or None when its config turns it off (or its factory declines, e.g. no token)."""
    config = settings.section(factory.config_section, factory.config)
    if not factory.enabled(config):
        return None
    component = factory.create(config, ctx)
    if component is None:
        log.warning("component.disabled", component=factory.name, kind=factory.kind)
    return component


def stage_processors(settings: CoreSettings, metrics: Metrics, clock: Callable[[], int], stage: str,
                     tracker: StateEvents, factories: Iterable[Factory[Any, Any]], *,
                     graph: GraphQueries | None = None) -> list[tuple[Processor, tuple[str, ...]]]:  # fmt: skip
    """The detectors and connectors of ``stage``, each with the output topic roles whose events it takes."""
    ctx = RuntimeContext(settings, metrics, clock, state_events=tracker, graph=graph)
    out = []
    for factory in factories:
        if factory.kind in ("detector", "connector") and factory.stage == stage:
            processor = create(factory, ctx, settings)
            if processor is not None:
                out.append((processor, tuple(factory.topics)))
    return out
