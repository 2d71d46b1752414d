"""``[repro]``: the repro worker (RED, repair plan, GREEN)."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section
from processors.repro.limits import STATEMENT_TIMEOUT_MS


class ReproConfig(Section):
    """The repro worker: deterministic repros (RED), repairs, and the GREEN proof."""

    enabled: bool = Field(False, description="run the repro worker (a consumer group on the incidents topic)")
    dsn: str = Field("", description="scratch PostgreSQL for repro runs (a database per run); default postgres_dsn")
    source_root: str = Field("", description="checkout of the service's code; empty = SQL-level repros only")
    copy_paths: list[str] = Field(default_factory=list, description="dirs under source_root copied for GREEN runs")
    source_map: dict[str, str] = Field(default_factory=dict, description="recorded path prefix -> local dir")
    call_specs: str = Field("", description='"module:NAME" of the CallSpecs for application-level repros')
    schema_sql: str = Field("", description="the tables' DDL for scratch databases (default: inferred from rows)")
    output_dir: str = Field("out/repros", description="where tests, JUnit XML and Code Quality reports go")
    statement_timeout_ms: int = Field(
        STATEMENT_TIMEOUT_MS,
        ge=100,
        le=600_000,
        description="statement_timeout and lock_timeout of a repro's recorded SQL (ms)",
    )
    max_attempts: int = Field(3, ge=1, description="repro attempts per fingerprint while none compiles (later "
                              "occurrences retry)")  # fmt: skip
    max_tracked_fingerprints: int = Field(10_000, ge=1, description="fingerprints whose repro attempts are remembered")
    reduce: bool = Field(True, description="reduce each RED repro to the fewest recorded statements and seed rows "
                         "that still fail the same way (delta debugging on the scratch database)")  # fmt: skip
    reduce_max_runs: int = Field(24, ge=1, le=10_000, description="candidate runs one reduction may make (then the "
                                 "smallest candidate so far is shipped)")  # fmt: skip
    reduce_max_s: float = Field(120.0, gt=0, le=3600, description="wall time one reduction may take, in seconds (then "
                                "the smallest candidate so far is shipped)")  # fmt: skip
