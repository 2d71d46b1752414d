"""The ``retry_storm`` finding type: what its ``data`` holds, and its remedies."""

from __future__ import annotations

from pydantic import Field

from processors.model.base import Frozen
from processors.model.finding import FindingType

TYPE = "retry_storm"
BACKOFF = "backoff_with_jitter"  # the retries came at once after each failure: wait, growing, randomised
BUDGET = "retry_budget"  # the retries back off but still multiply the load: cap retries per window / per client


class RetryStormData(Frozen):
    """One window's retries of one call on one route: attempts, the amplification on the dependency, the gaps."""

    service: str
    route: str
    dependency: str  # the callee service, or the database system / namespace
    operation: str  # the route it served, the statement's shape, or the client span's name
    window: str
    within_trace: bool  # some request made min_attempts attempts, each after a failure
    burst: bool  # min_burst_traces requests retried, the dependency saw min_amplification and min_failed_share
    requests: int = Field(ge=1)  # requests that retried the call
    requests_seen: int = Field(ge=0)  # requests of the route in the window
    attempts: int = Field(ge=1)  # attempts of the call in the window (every request of the route)
    logical_calls: int = Field(ge=1)  # calls the code meant to make: attempts less the retries
    amplification: float = Field(ge=1)  # attempts / logical calls
    failed_share: float = Field(ge=0, le=1)  # of the attempts in the window (every request's counted when they fail)
    max_attempts: int = Field(ge=2)  # in the worst request
    exhausted: int = Field(ge=0)  # retried calls whose last attempt failed too
    retry_gap_ms_mean: float  # from a failed attempt's end to the next attempt's start
    example_trace: str


FINDING_TYPE = FindingType(
    name=TYPE,
    title="Retry storm",
    description="one call repeated after errors, within a request or across a burst of requests, multiplying the "
    "load on a failing dependency",
    data=RetryStormData,
    remedies=(BACKOFF, BUDGET),
)
