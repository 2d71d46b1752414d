"""Deploy marks: a time boundary a person sets (``trace-repro deploy mark``) where telemetry names no build.

A build is identified by ``service.version``, else by the deploy's commit, else by its image digest (the decoders
choose: :class:`~processors.model.events.Resource`). A service whose telemetry carries none of them is one build
for ever, and never gets a verdict; a :class:`DeployMark` splits it: from the mark's time on (event time), its
telemetry counts for the build named after the mark, before the first mark for the unnamed build ``""``.

Marks travel on ``trace-repro.contracts`` (keyed by service), the control topic the proof desk already consumes,
so that they reach the instance that judges the service in order with the contracts, with no new topic or
consumer. The desk keeps each mark as keyed state holding its record: the record's offset stays uncommitted while
the mark is kept, so a restarted daemon reads it again (recovery by replay, like every other piece of state). A
mark applies to telemetry counted after the desk read it: mark a deploy when it starts (``--at`` defaults to now),
not long after its traffic was judged.
"""

from __future__ import annotations

import bisect
import time
from typing import ClassVar, Literal

from pydantic import Field

from processors.model.base import SCHEMA_VERSION, Published

MARK = "mark"  # how a build named by a deploy mark was identified (the others: "version", "commit", "digest")


class DeployMark(Published):
    """``service`` was deployed at ``at_unix_ms``: its unversioned telemetry from then on is build ``name``."""

    identity: ClassVar[tuple[str, ...]] = ("service", "name", "at_unix_ms")
    topic: ClassVar[str] = "contracts"

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["deploy_mark"] = "deploy_mark"
    service: str = Field(min_length=1, max_length=256)
    at_unix_ms: float = Field(ge=0)
    name: str = Field("", max_length=256)  # "" = "deploy@<UTC time of the mark>"

    @property
    def build(self) -> str:
        """The name of the build the mark starts."""
        return self.name or "deploy@" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at_unix_ms / 1000))


class Marks:
    """The marks of every service, by time: which marked build an unversioned record at some time belongs to."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[str, list[tuple[int, str]]] = {}  # service -> sorted (at_ns, build)

    def add(self, mark: DeployMark) -> None:
        marks = self._at.setdefault(mark.service, [])
        entry = (int(mark.at_unix_ms * 1_000_000), mark.build)
        if entry not in marks:
            bisect.insort(marks, entry)

    def remove(self, mark: DeployMark) -> None:
        marks = self._at.get(mark.service, [])
        entry = (int(mark.at_unix_ms * 1_000_000), mark.build)
        if entry in marks:
            marks.remove(entry)

    def build_at(self, service: str, at_ns: int) -> str:
        """The build of the latest mark of ``service`` at or before ``at_ns``; "" before the first (or none)."""
        marks = self._at.get(service)
        if not marks:
            return ""
        i = bisect.bisect_right(marks, (at_ns, "\U0010ffff"))
        return marks[i - 1][1] if i else ""


def identify(marks: Marks, service: str, version: str, how: str, at_ns: int) -> tuple[str, str]:
    """(build, how it was identified): the telemetry's own build, else the deploy mark's at ``at_ns``."""
    if version:
        return version, how
    marked = marks.build_at(service, at_ns)
    return (marked, MARK) if marked else ("", "")


__all__ = ["MARK", "DeployMark", "Marks", "identify"]
