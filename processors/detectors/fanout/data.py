"""The ``serialized_fanout`` finding type: what its ``data`` holds, and its remedies."""

from __future__ import annotations

from pydantic import Field

from processors.model.base import Frozen
from processors.model.finding import FindingType

TYPE = "serialized_fanout"
PARALLELIZE = "parallelize_calls"  # issue the independent calls concurrently (gather, a pool sized for N)


class FanoutData(Frozen):
    """One window's serialized fan-out on one route: the calls, their concurrency, what concurrency would save."""

    service: str
    route: str
    dependency: str  # the callee service, or the database system / namespace
    operation: str  # the route it served, the statement's shape, or the client span's name
    parent_operation: str
    window: str
    requests: int = Field(ge=1)
    requests_seen: int = Field(ge=0)
    max_calls: int = Field(ge=2)  # N, in the worst request
    max_concurrency: int = Field(ge=1)  # k, in the worst request
    calls_mean: float
    serial_ms_mean: float  # wall time the calls took together, per affected request
    ideal_ms_mean: float  # the longest call: what they would take all at once
    saving_ms_mean: float  # what full concurrency would save on the critical path, per affected request
    saving_ms_max: float
    saving_share_mean: float = Field(ge=0, le=1)  # as a share of the request's duration
    example_trace: str


FINDING_TYPE = FindingType(
    name=TYPE,
    title="Serialized fan-out",
    description="N independent calls to one dependency in one request, run k at a time (k much less than N)",
    data=FanoutData,
    remedies=(PARALLELIZE,),
)
