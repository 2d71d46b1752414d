"""The proof judge's bookkeeping: counts per build over event-time slices, and the watches of contracts.

A :class:`Tally` round-trips through JSON (``to_json``/``from_json``) so that the cumulative counts of each
(build, input partition) can live on the graph: what several ingest replicas count adds up, and a restarted
daemon resumes with what it had counted.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TypeVar

from processors.connectors.proofs.contracts import Signature
from processors.model.contract import ProofContract

K = TypeVar("K", bound=Hashable)
COUNTED_IDS = 1024  # per (build, partition): a replay after a crash re-reads what was not committed, far fewer


@dataclass(slots=True)
class Tally:
    """Counts of one build over some event-time span."""

    requests: int = 0
    errors: int = 0
    routes: dict[tuple[str, str], int] = field(default_factory=dict)  # (label, operation) -> requests
    failures: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (label, operation, error) -> count
    sites: dict[tuple[str, str, str], dict[str, int]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # event name -> records
    collisions: dict[str, int] = field(default_factory=dict)  # signature -> occurrences all on this build
    collision_sites: dict[str, dict[str, int]] = field(default_factory=dict)
    mixed: dict[str, int] = field(default_factory=dict)  # signature -> occurrences with another build
    latency: dict[tuple[str, str], dict[int, int]] = field(default_factory=dict)  # route -> grid bucket -> requests
    sampled: dict[str, int] = field(default_factory=dict)  # sampling label ("0.1", "unknown") -> requests
    sampled_errors: dict[str, int] = field(default_factory=dict)  # sampling label -> failed requests
    # The event ids of the occurrences (collisions, findings) counted straight into a contribution, late for their
    # slice: the newest COUNTED_IDS, stored with it, so that one replayed after a restart is not counted twice.
    # Never merged: a build's settled sum has no use for them.
    counted: list[str] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.requests += other.requests
        self.errors += other.errors
        add_counts(self.routes, other.routes)
        add_counts(self.failures, other.failures)
        add_counts(self.events, other.events)
        add_counts(self.collisions, other.collisions)
        add_counts(self.mixed, other.mixed)
        add_counts(self.sampled, other.sampled)
        add_counts(self.sampled_errors, other.sampled_errors)
        for k, places in other.sites.items():
            add_counts(self.sites.setdefault(k, {}), places)
        for s, places in other.collision_sites.items():
            add_counts(self.collision_sites.setdefault(s, {}), places)
        for route, buckets in other.latency.items():
            add_counts(self.latency.setdefault(route, {}), buckets)

    def to_json(self) -> str:
        """The counts as JSON (tuple keys as lists)."""
        return json.dumps({
            "requests": self.requests, "errors": self.errors,
            "routes": [[*k, n] for k, n in sorted(self.routes.items())],  # canonical: a replay writes the same
            "failures": [[*k, n] for k, n in sorted(self.failures.items())],
            "sites": [[*k, places] for k, places in sorted(self.sites.items())],
            "events": self.events, "collisions": self.collisions, "collision_sites": self.collision_sites,
            "mixed": self.mixed, "sampled": self.sampled, "sampled_errors": self.sampled_errors,
            "latency": [[*k, sorted(buckets.items())] for k, buckets in sorted(self.latency.items())],
            "counted": self.counted,
        }, sort_keys=True)  # fmt: skip

    @classmethod
    def from_json(cls, text: str) -> Tally:
        doc = json.loads(text)
        return cls(
            requests=int(doc["requests"]),
            errors=int(doc["errors"]),
            routes={(str(a), str(b)): int(n) for a, b, n in doc["routes"]},
            failures={(str(a), str(b), str(c)): int(n) for a, b, c, n in doc["failures"]},
            sites={(str(a), str(b), str(c)): dict(places) for a, b, c, places in doc["sites"]},
            events=dict(doc["events"]),
            collisions=dict(doc["collisions"]),
            collision_sites={k: dict(v) for k, v in doc["collision_sites"].items()},
            mixed=dict(doc["mixed"]),
            latency={
                (str(a), str(b)): {int(k): int(n) for k, n in buckets} for a, b, buckets in doc.get("latency", [])
            },  # (absent from contributions stored before)
            sampled={str(k): int(n) for k, n in doc.get("sampled", {}).items()},  # (absent before sampling was read)
            sampled_errors={str(k): int(n) for k, n in doc.get("sampled_errors", {}).items()},
            counted=[str(i) for i in doc.get("counted", [])],  # (absent before occurrences were deduplicated)
        )


def add_counts(into: dict[K, int], other: dict[K, int]) -> None:
    for k, v in other.items():
        into[k] = into.get(k, 0) + v


@dataclass(slots=True)
class Build:
    """One (service, version): when it was seen, and its settled counts summed over every input partition."""

    service: str
    version: str
    first_ns: int
    last_ns: int
    revision: str = ""
    settled: Tally = field(default_factory=Tally)
    identified_by: str = ""  # "version", "commit", "digest", "mark" (processors.connectors.proofs.marks)


PartKey = tuple[str, str, str]  # (service, version, input partition)
SliceKey = tuple[str, str, int, str]  # (service, version, slice start, input partition)


@dataclass(slots=True)
class Contribution:
    """What one input partition counted for one build, over every slice settled so far (cumulative)."""

    tally: Tally = field(default_factory=Tally)
    settled_until_ns: int = 0
    first_ns: int = 0
    last_ns: int = 0
    revision: str = ""


@dataclass(slots=True)
class Watch:
    emitted: list[str] = field(default_factory=list)
    looked: bool = False  # the look at min_requests happened
    planned_look: bool = False  # latency contracts: the look at the planned requests happened
    closed: bool = False


@dataclass(slots=True)
class Bound:
    contract: ProofContract
    signature: Signature
    service: str
    version: str


@dataclass(frozen=True, slots=True)
class Matched:
    count: int
    requests: int
    sites: list[str]
