"""Fault tests on the shipped configuration: ``config/trace-repro.toml`` as it is, only the deployment's own names set.

:func:`shipped_env` sets what every deployment sets (the engines' addresses, the environment, the consumer group,
topic names, the HTTP port, and the GitLab sink's URL, project and token); every event-time, detection, polling and
graph setting is the file's: trace gap 10 s, lateness 5 s, idle 5 s, causal window 2 s, graph policy ``paths``,
500 records per poll. The names follow :func:`tests.harness.harness_env`, so :mod:`tests.faults.faultkit`'s helpers
(``cdc_topic``, ``wait_committed_past``, ...) work on these harnesses too.

Under the ``paths`` policy only the traces that touch a row (or fail) are ``Trace`` nodes, and of those the access
spans with their ancestors: with :class:`~tests.faults.faultkit.Traffic`'s requests, every span of a capture or a
planted job and request, and nothing of a ``GET /products``. :class:`PathsTraffic` remembers which traces those are,
and :func:`assert_paths_exactly_once` checks the graph against them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from bench.gitlab_server import FakeGitLab
from streamer import config
from tests.faults.faultkit import GITLAB_PROJECT, GITLAB_TOKEN, Message, Traffic, drops, graph_counts, occurrences
from tests.harness import Harness

SHIPPED = Path(__file__).resolve().parents[2] / "config" / "trace-repro.toml"
ROLES = ("spans", "logs", "accesses", "dlq", "incidents", "repros", "verdicts", "contracts")


def shipped_env(bootstrap: str, falkordb_url: str, gitlab: FakeGitLab | None = None) -> dict[str, str]:
    """``TRACE_REPRO_*`` of a deployment of the shipped file: addresses, names and the GitLab sink, nothing else."""
    tag = uuid.uuid4().hex[:8]
    env = {
        "TRACE_REPRO_KAFKA_BOOTSTRAP": bootstrap,
        "TRACE_REPRO_FALKORDB_URL": falkordb_url,
        "TRACE_REPRO_ENVIRONMENT": f"shipped_{tag}",
        "TRACE_REPRO_HTTP__PORT": "0",
        "TRACE_REPRO_KAFKA__GROUP_ID": f"trace-repro-{tag}",
        "TRACE_REPRO_KAFKA__AUTO_OFFSET_RESET": "earliest",  # (data may come before the daemon)
        "TRACE_REPRO_KAFKA__CDC_PATTERN": rf"^cdc{tag}\.[^.]+\.[^.]+$",
        **{f"TRACE_REPRO_KAFKA__{role.upper()}_TOPIC": f"{role}-{tag}" for role in ROLES},
    }
    if gitlab is not None:
        env |= {"TRACE_REPRO_GITLAB__URL": gitlab.url, "TRACE_REPRO_GITLAB__PROJECT": GITLAB_PROJECT,
                "TRACE_REPRO_GITLAB_TOKEN": GITLAB_TOKEN}  # fmt: skip
    return env


def shipped_harness(env: dict[str, str]) -> Harness:
    """An in-process daemon on the shipped file with ``env`` (a replica of another harness given the same env)."""
    settings = config.load(SHIPPED, env=env)
    w = settings.windows
    assert (w.trace_gap_s, w.allowed_lateness_s, w.idle_s, settings.graph_policy.detail) == (10, 5, 5, "paths")
    return Harness(settings, settings.kafka.bootstrap, settings.falkordb.url)


class PathsTraffic(Traffic):
    """:class:`~tests.faults.faultkit.Traffic` that also remembers, per trace touching a row, its span ids."""

    def __init__(self, spans_topic: str, cdc_topic: str, *, root_lag: int = 0) -> None:
        super().__init__(spans_topic, cdc_topic, root_lag=root_lag)
        self.touching: dict[str, set[str]] = {}  # trace id -> span ids, for the traces with a statement

    def _trace(
        self, route: str, function: str, statements: Sequence[tuple[str, str]], start_ns: int
    ) -> tuple[str, list[Message]]:
        before = set(self.expected.spans)
        trace_id, out = super()._trace(route, function, statements, start_ns)
        if statements:
            self.touching[trace_id] = self.expected.spans - before
        return trace_id, out


def assert_paths_exactly_once(harness: Harness, traffic: PathsTraffic) -> None:
    """Every trace that touched a row is one ``Trace`` node with its root and status, each of its spans one ``Span``
    with its ``OF`` and ``CHILD_OF`` edges once, each write one ``WROTE`` edge; no other trace is a node."""
    expected = traffic.expected
    rows = harness.graph_rows("MATCH (t:Trace) RETURN t.id, t.root, t.status")
    twice = [t for t, n in Counter(r[0] for r in rows).items() if n > 1]
    assert not twice, f"Trace nodes twice: {twice[:5]}"
    got = {r[0]: (r[1], r[2]) for r in rows}
    missing = traffic.touching.keys() - got.keys()
    assert not missing, (
        f"{len(missing)} of {len(traffic.touching)} traces touching a row missing from the graph, "
        f"e.g. {sorted(missing)[:3]}"
    )
    assert got.keys() == traffic.touching.keys(), (
        f"unexpected Trace nodes: {sorted(got.keys() - traffic.touching.keys())[:5]}"
    )
    wrong = {t: got[t] for t in traffic.touching if got[t] != expected.traces[t]}
    assert not wrong, f"{len(wrong)} traces with a wrong root/status: {list(wrong.items())[:3]}"

    spans = [r[0] for r in harness.graph_rows("MATCH (s:Span) RETURN s.id")]
    twice = [s for s, n in Counter(spans).items() if n > 1]
    assert not twice, f"Span nodes twice: {twice[:5]}"
    want = set().union(*traffic.touching.values())
    assert set(spans) == want, f"{len(want - set(spans))} spans missing, {len(set(spans) - want)} unexpected"
    assert harness.count("MATCH (:Span)-[o:OF]->(:Trace) RETURN count(o)") == len(want)
    edges = Counter((r[0], r[1]) for r in harness.graph_rows("MATCH (c:Span)-[:CHILD_OF]->(p:Span) RETURN c.id, p.id"))
    assert not [e for e, n in edges.items() if n > 1], "CHILD_OF edges twice"
    parents = {(child, parent) for child, (parent, _) in expected.parents.items() if child in want}
    assert edges.keys() == parents, f"{len(parents - edges.keys())} CHILD_OF edges missing"
    assert harness.count("MATCH (:Span)-[w:WROTE]->(:Entity) RETURN count(w)") == expected.writes


async def wait_paths(harness: Harness, traffic: PathsTraffic, what: str, timeout_s: float = 90) -> None:
    """Wait until the graph holds every trace that touched a row and an occurrence per planted collision."""
    expected = traffic.expected
    deadline = time.monotonic() + timeout_s
    while True:
        traces, found = graph_counts(harness)[0], occurrences(harness)
        if traces >= len(traffic.touching) and found >= len(expected.planted):
            return
        if harness.task is not None and harness.task.done():
            harness.task.result()
        if time.monotonic() > deadline:
            rows = harness.graph_rows("MATCH (o:Occurrence) RETURN o.entity")
            missed = sorted(set(expected.planted) - {r[0] for r in rows})
            raise AssertionError(f"timed out waiting for {what}: {traces} of {len(traffic.touching)} traces in the "
                                 f"graph; {found} occurrences for {len(expected.planted)} planted collisions, none on "
                                 f"{missed}; the daemon's drops and late events: {drops(harness)}")  # fmt: skip
        await asyncio.sleep(0.2)


def counted(harness: Harness) -> dict[str, float]:
    """What the daemon counted that a fault test reports: the Kafka sink's and the stages' retries, waits and
    refusals, graph retries, drops and late events (each non-zero one)."""
    if harness.daemon is None:
        return {}
    out: dict[str, float] = dict(drops(harness))
    kafka = harness.daemon.metrics.telemetry("kafka")
    topics = set(harness.settings.kafka.model_dump().values())
    out |= {f"kafka.{event}": n for event, n in kafka.events.items() if n and event not in topics}
    retries = harness.metric_total("trace_repro_graph_write_retries_total")
    if retries:
        out["graph_write_retries"] = retries
    return out
