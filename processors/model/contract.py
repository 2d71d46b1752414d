"""A proof contract: what a build must show in production before its fix counts as proven."""

from __future__ import annotations

import re
from typing import ClassVar, Literal

from pydantic import Field

from processors.model.base import SCHEMA_VERSION, Published
from processors.model.units import zero_error_floor

# A must-start event's name: what a repair may write into code as a string literal and a span name.
EVENT_NAME = re.compile(r"^[A-Za-z_][\w.\-:/]{0,199}$")


def promised_event(fingerprint: str) -> str:
    """The must-start event an incident's contract promises until a person names another one (the issue's *Proof
    contract* section shows it; the "Proves #N" repair emits it): ``trace_repro.fix.<fingerprint>``."""
    return "trace_repro.fix." + (re.sub(r"[^A-Za-z0-9_.-]+", "_", fingerprint).strip("._") or "incident")[:64]


DEFAULT_ALPHA = 0.05
DEFAULT_WATCH_S = 3600.0
DEFAULT_P0 = 0.01  # the rate assumed when nothing better is known: 299 requests at alpha 0.05
DEFAULT_MIN_REQUESTS = zero_error_floor(DEFAULT_P0, DEFAULT_ALPHA)
ANY_ROUTE = "*"


class ProofContract(Published):
    """One incident's proof obligation, published on ``trace-repro.contracts`` (keyed by fingerprint)."""

    identity: ClassVar[tuple[str, ...]] = ("signature",)
    topic: ClassVar[str] = "contracts"

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["contract"] = "contract"
    signature: str = Field(min_length=3)
    fingerprint: str = Field(min_length=1)  # the incident's
    must_start: str = ""  # the event the fix must start emitting; "" = none promised (e.g. a lock added)
    watch_s: float = Field(DEFAULT_WATCH_S, gt=0)
    min_requests: int = Field(DEFAULT_MIN_REQUESTS, ge=1)
    alpha: float = Field(DEFAULT_ALPHA, gt=0, lt=1)
    baseline_rate: float | None = None  # p0 the floor came from, when known
    service: str = ""  # "" = the first service the signature is seen in
    version: str = ""  # the build the defect was seen on; "" = the first build the signature is seen in
    routes: list[str] = Field(default_factory=list)  # collisions: the routes whose requests are the traffic
    reports: list[str] = Field(default_factory=list)  # what reports the defect in code (exception types): the gate
    issue: int | None = None
    created_unix_ms: float = 0.0
    automatic: bool = False  # made by the daemon for an incident or a regression (a person's contract wins over it)
    baseline_version: str = ""  # latency contracts: the build before the regression (its share over the threshold)
