"""A tiny detector as a user would add one (the example of docs/extending.md): slow SQL statements.

One folder: its config section, its published event, the detector (a ``Processor`` of the ingest stage) and its
factory. Registering it is one line in the components list (here: ``default().with_extra(FACTORY)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import Field

from processors.api.component import Emit, Factory, Processor, Section
from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.events import Access
from processors.model.trace import ClosedTrace


class SlowStatementsConfig(Section):
    """``[slow_statements]``"""

    threshold_ms: float = Field(500.0, gt=0, description="a DB statement slower than this is reported")
    max_pending: int = Field(1_000, ge=1, description="findings held until the next watermark")


class SlowStatement(Published):
    """One DB statement slower than the threshold (published on the incidents topic, kind ``slow_statement``)."""

    identity: ClassVar[tuple[str, ...]] = ("span_id",)

    schema_version: Literal[1] = 1
    kind: Literal["slow_statement"] = "slow_statement"
    fingerprint: str  # the statement: one key per statement shape on Kafka
    service: str
    statement: str
    span_id: str
    duration_ms: float


class SlowStatements(Processor):
    name = "slow_statements"

    def __init__(self, config: SlowStatementsConfig, telemetry: Telemetry) -> None:
        self.config = config
        self.telemetry = telemetry.declare("max_pending")
        self._found: list[SlowStatement] = []

    def on_trace(self, trace: ClosedTrace, accesses: Sequence[Access]) -> None:
        for span in trace.spans:
            if span.db is not None and span.duration_ms > self.config.threshold_ms:
                if len(self._found) >= self.config.max_pending:
                    self.telemetry.drop("max_pending")
                    continue
                self._found.append(SlowStatement(fingerprint=span.db.statement[:64], service=span.resource.service,
                                                 statement=span.db.statement, span_id=span.span_id,
                                                 duration_ms=span.duration_ms))  # fmt: skip

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        out.events.extend(self._found)
        self.telemetry.count("found", len(self._found))
        self._found = []


FACTORY = Factory(
    kind="detector",
    name="slow_statements",
    config=SlowStatementsConfig,
    stage="ingest",
    events=(SlowStatement,),
    create=lambda config, ctx: SlowStatements(config, ctx.telemetry("slow_statements")),
)
