"""The components the daemon is built from: one list (like the OpenTelemetry Collector's ``components.go``).

Adding a detector, a connector or a sink is one folder with its config, factory and component, and one line here.
Decoders are registered by name in ``streamer.decode.registry`` and bound to topics by the ``[kafka]`` section.
The graph and Kafka sinks are the runtime's own (every daemon has them; ``[falkordb]``, ``[kafka]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from processors.api.component import Factory
from processors.connectors.proofs import FACTORY as PROOF
from processors.connectors.repro import FACTORY as REPRO
from processors.detectors.blocked_by import FACTORY as BLOCKED_BY
from processors.detectors.collisions import FACTORY as COLLISIONS
from processors.detectors.contention import FACTORY as CONTENTION
from processors.detectors.fanout import FACTORY as FANOUT
from processors.detectors.hangs import FACTORY as HANGS
from processors.detectors.n_plus_one import FACTORY as N_PLUS_ONE
from processors.detectors.regressions import FACTORY as REGRESSIONS
from processors.detectors.regressions import JUDGE as REGRESSION_JUDGE
from processors.detectors.retry_storm import FACTORY as RETRY_STORM
from sinks.files import FACTORY as FILES
from sinks.gitlab import FACTORY as GITLAB
from streamer.decode.registry import DECODERS, DecoderFactory

FACTORIES: tuple[Factory[Any, Any], ...] = (
    COLLISIONS,  # detector, stage "entities": cross-trace collisions on one row
    REGRESSIONS,  # detector, stage "ingest": windowed service statistics, relayed to its judge
    REGRESSION_JUDGE,  # detector, stage "entities": latency and error regressions on every instance's statistics
    BLOCKED_BY,  # detector, stage "entities": statements that waited on another trace's row lock
    N_PLUS_ONE,  # detector, stage "ingest": one query per item in a loop, per request
    FANOUT,  # detector, stage "ingest": N calls to one dependency in a request run k at a time
    RETRY_STORM,  # detector, stage "ingest": calls repeated after errors, within a request or across a burst
    HANGS,  # detector, stage "ingest": hops with no timeout (calls hung far past their hop's p99, timeouts unanswered)
    CONTENTION,  # detector, stage "ingest": latency rising with its own in-flight concurrency
    PROOF,  # connector, stage "ingest": proof contracts and verdicts
    REPRO,  # connector, incidents -> repros: RED, repair plan, GREEN
    GITLAB,  # sink: GitLab issues
    FILES,  # sink: JSON-lines files
)


@dataclass(frozen=True)
class Components:
    """Decoders by name and the factories of every other component, in build order."""

    decoders: Mapping[str, DecoderFactory]
    factories: tuple[Factory[Any, Any], ...]

    def with_extra(self, *factories: Factory[Any, Any]) -> Components:
        """These components and ``factories`` (for tests and embedders; the daemon uses :func:`default`)."""
        names = {f.name for f in self.factories}
        clash = sorted(names & {f.name for f in factories})
        if clash:
            raise ValueError(f"component names already taken: {clash}")
        return replace(self, factories=(*self.factories, *factories))

    def of(self, kind: str) -> list[Factory[Any, Any]]:
        return [f for f in self.factories if f.kind == kind]


def default() -> Components:
    return Components(DECODERS, FACTORIES)
