"""The ``n_plus_one`` finding type: what its ``data`` holds, and its remedies."""

from __future__ import annotations

from pydantic import Field

from processors.model.base import Frozen
from processors.model.finding import FindingType

TYPE = "n_plus_one"
BATCH_QUERY = "batch_query"  # read the rows in one query (IN list, JOIN) instead of one per item
BULK_WRITE = "bulk_write"  # write the rows in one statement (multi-row INSERT, UPDATE ... WHERE id IN)


class NPlusOneData(Frozen):
    """One window's N+1 on one route: the statement, how often, and what it cost the requests."""

    service: str
    route: str
    parent_operation: str  # the span the loop runs under (its code.function.name, else its name)
    statement_shape: str  # literals and placeholders masked
    db_system: str
    window: str
    requests: int = Field(ge=1)  # requests of the route that ran the loop
    requests_seen: int = Field(ge=0)  # requests of the route in the window (this instance's partitions)
    statements: int = Field(ge=1)  # repeated statements over those requests
    max_per_request: int = Field(ge=1)
    mean_per_request: float
    repeated_ms_mean: float  # time the repeated statements took per affected request
    critical_path_share_mean: float = Field(ge=0, le=1)  # their share of the request's critical path
    critical_path_share_max: float = Field(ge=0, le=1)
    with_parameters: bool  # parameters were recorded (and differed); else N identical-shape statements
    example_trace: str


FINDING_TYPE = FindingType(
    name=TYPE,
    title="N+1 queries",
    description="one statement shape run once per item in a loop inside one request, one after the other",
    data=NPlusOneData,
    remedies=(BATCH_QUERY, BULK_WRITE),
)
