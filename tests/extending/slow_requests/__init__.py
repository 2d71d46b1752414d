"""A detector as a user adds one (the example of docs/extending.md): requests slower than a threshold, as findings.

One folder: its config section, its finding type (registered, with the model its data validates against), the
detector (a ``Processor`` of the ingest stage) and its factory. It publishes ``FindingEvent`` s, so every sink, the
graph and MCP handle them with no code of theirs: a GitLab issue in the generic body, ``findings.jsonl``, an
``Incident:Finding`` node, ``list_findings(type="slow_request")``. Registering it is one line in the components list
(here: ``default().with_extra(FACTORY)``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from processors.api.component import Emit, Factory, Processor, Section
from processors.api.telemetry import Telemetry
from processors.model.base import Frozen
from processors.model.events import Access, SpanKind
from processors.model.finding import ContractRules, FindingEvent, FindingType, Point, Series, Subject, register_type
from processors.model.trace import ClosedTrace


class SlowRequestsConfig(Section):
    """``[slow_requests]``"""

    threshold_ms: float = Field(1_000.0, gt=0, description="a request (server span) slower than this is reported")
    max_pending: int = Field(1_000, ge=1, description="findings held until the next watermark")


class SlowRequest(Frozen):
    """The data of a ``slow_request`` finding: the damage as values, for machines."""

    duration_ms: float
    threshold_ms: float
    db_statements: int


SLOW_REQUEST = FindingType(
    name="slow_request",
    title="Slow request",
    description="a request whose server span took longer than [slow_requests] threshold_ms",
    data=SlowRequest,
    remedies=("profile",),
)
register_type(SLOW_REQUEST)  # known to every sink and to MCP in this process


class SlowRequests(Processor):
    name = "slow_requests"

    def __init__(self, config: SlowRequestsConfig, telemetry: Telemetry) -> None:
        self.config = config
        self.telemetry = telemetry.declare("max_pending")
        self._found: list[FindingEvent] = []

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        root = trace.root
        if root.kind != SpanKind.SERVER or root.duration_ms <= self.config.threshold_ms:
            return
        if len(self._found) >= self.config.max_pending:
            self.telemetry.drop("max_pending")  # a bound that is hit is a counted drop
            return
        service, route = root.resource.service, root.route or root.name
        start_ms = root.start_ns / 1e6
        db = [s for s in trace.spans if s.db is not None]
        data = SlowRequest(duration_ms=root.duration_ms, threshold_ms=self.config.threshold_ms, db_statements=len(db))
        chart = Series(name="Statements of the request", x_label="start (ms)", y_label="duration (ms)",
                       points=[Point(x=s.start_ns / 1e6 - start_ms, y=s.duration_ms) for s in db])  # fmt: skip
        fingerprint = f"slow_request:{service}:{route}"  # stable across deploys: the same route is the same issue
        finding = FindingEvent(
            type=SLOW_REQUEST.name,
            fingerprint=fingerprint,
            occurrence=root.span_id,
            title=f"{route} took {root.duration_ms:.0f} ms",
            subject=Subject(service=service, operation=route, version=root.resource.version),
            severity="low",
            remedy="profile",
            evidence=[f"{route} took {root.duration_ms:.1f} ms (threshold {self.config.threshold_ms:.0f} ms)"],
            data=data.model_dump(),
            series=[chart],
            traces=[trace.trace_id],
            first_seen_unix_ms=start_ms,
            detected_at_unix_ms=start_ms,
            contract=ContractRules(signature=f"{SLOW_REQUEST.name}:{fingerprint}", service=service, routes=[route]),
        )
        self._found.append(finding)

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        out.events.extend(self._found)  # published, recorded in the graph, handed to every sink
        self.telemetry.count("found", len(self._found))
        self._found = []


FACTORY = Factory(
    kind="detector",
    name="slow_requests",
    config=SlowRequestsConfig,
    stage="ingest",
    events=(FindingEvent,),
    create=lambda config, ctx: SlowRequests(config, ctx.telemetry("slow_requests")),
)
