"""The repro worker as a component: its section ``[repro]``, the incidents topic it consumes, how it is built.

Off unless ``repro.enabled``; the worker's module (libcst, the compiler and the repair planner) is imported
by :func:`create`, so a daemon without the worker never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from processors.api.component import Context, Factory
from processors.connectors.repro.config import ReproConfig
from processors.detectors.collisions.config import CollisionConfig
from processors.model.outputs import ReproEvent

if TYPE_CHECKING:
    from processors.connectors.repro.worker import ReproWorker


def create(config: ReproConfig, ctx: Context) -> ReproWorker:
    from processors.connectors.repro.worker import ReproWorker

    if ctx.graph is None:
        raise RuntimeError("the repro worker needs the graph (where incidents and their writers are)")
    return ReproWorker(
        config,
        graph=ctx.graph,
        publish=ctx.publish,
        dsn=dsn.get_secret_value() if (dsn := ctx.secret("postgres_dsn")) is not None else "",
        invariants=(collisions := ctx.section("collisions", CollisionConfig)).invariants,
        telemetry=ctx.telemetry("repro"),
        max_attempts=config.max_attempts,
        max_tracked=config.max_tracked_fingerprints,
        detection={"window_s": collisions.window_s, "settle_s": collisions.settle_s, "skew_ms": collisions.skew_ms},
    )


FACTORY: Factory[ReproConfig, ReproWorker] = Factory(
    kind="connector", name="repro", config=ReproConfig, create=create, topics=("incidents",), events=(ReproEvent,),
    enabled=lambda c: c.enabled,
)  # fmt: skip

__all__ = ["FACTORY", "create"]
