"""The daemon's configuration: a TOML file plus ``TRACE_REPRO_*`` environment variables.

Precedence: environment > TOML file > defaults. Every model is frozen and rejects unknown keys, so a typo fails
at start with the key's dotted name. Nested keys come from the environment with ``__`` (for example
``TRACE_REPRO_KAFKA__GROUP_ID``); the engine addresses that ``trace-repro local up`` writes have short aliases
(``TRACE_REPRO_KAFKA_BOOTSTRAP``, ``TRACE_REPRO_FALKORDB_URL``, ``TRACE_REPRO_POSTGRES_DSN``).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaConfig(_Section):
    """Where to consume from and what to call things on the bus."""

    bootstrap: str = Field("127.0.0.1:9092", description="bootstrap servers, comma-separated")
    group_id: str = Field("trace-repro", description="consumer group of stage 1 (stage 2 appends '.entities')")
    spans_topic: str = "otlp_spans"
    logs_topic: str = "otlp_logs"
    cdc_pattern: str = Field(r"^shop\.[^.]+\.[^.]+$", description="regex matching Debezium topics")
    span_encoding: str = Field("otlp_proto", pattern="^(otlp_proto|otlp_json)$")
    accesses_topic: str = Field(
        "trace-repro.accesses", description="internal stage-1 -> stage-2 topic, keyed by entity"
    )
    accesses_partitions: int = Field(6, ge=1, description="partitions of the internal topic when we create it")
    incidents_topic: str = "trace-repro.incidents"
    repros_topic: str = "trace-repro.repros"
    verdicts_topic: str = "trace-repro.verdicts"
    contracts_topic: str = Field("trace-repro.contracts", description="proof contracts added by CLI or other tools")
    dlq_topic: str = "trace-repro.dlq"
    max_poll_records: int = Field(500, ge=1, description="messages per getmany() per call")
    fetch_max_bytes: int = Field(50 * 1024 * 1024, ge=1024)
    poll_timeout_ms: int = Field(200, ge=1)


class FalkorDBConfig(_Section):
    url: str = "redis://127.0.0.1:6379"
    graph: str = Field("", description='graph name; default "trace_repro_<environment>" (one graph per environment)')
    batch_rows: int = Field(2000, ge=1, description="rows per UNWIND statement")
    query_timeout_ms: int = Field(30_000, ge=100)


class WindowConfig(_Section):
    """Event-time bounds: windows, lateness, trace assembly."""

    window_s: float = Field(60.0, gt=0, description="length of aggregate windows (CALLS edges, stats)")
    allowed_lateness_s: float = Field(5.0, ge=0, description="watermark = max event time - this")
    trace_gap_s: float = Field(10.0, gt=0, description="a trace closes after this much event-time inactivity")
    max_open_traces: int = Field(200_000, ge=1, description="bound on traces being assembled")
    max_spans_per_trace: int = Field(5_000, ge=1)
    idle_s: float = Field(5.0, gt=0, description="wall time without input after which event time follows the clock")


class DecodeConfig(_Section):
    """Which span attributes carry application facts, and how much of an attribute we keep."""

    tx_id_attribute: str = Field("db.transaction.id", description="span attribute holding the DB transaction id")
    row_version_attribute: str = Field("db.row.version", description="span attribute holding the row version read")
    idempotency_key_attribute: str = "app.idempotency_key"
    max_attribute_bytes: int = Field(65_536, ge=64, description="longer attributes make the message oversize")
    oversize: str = Field("dlq", pattern="^(dlq|truncate)$", description="oversize attribute: DLQ or truncate+count")


class SqlConfig(_Section):
    """How statements map to rows: key columns per table, version columns, identity of inserts."""

    key_columns: dict[str, list[str]] = Field(default_factory=dict, description='table -> key columns (default ["id"])')
    version_columns: list[str] = Field(default_factory=lambda: ["version"])
    insert_identity: dict[str, list[str]] = Field(
        default_factory=dict, description="table -> columns identifying an insert whose key the DB assigns"
    )
    statement_cache: int = Field(4096, ge=1, description="parsed statement shapes kept (LRU)")


class CorrelationConfig(_Section):
    """Row change ↔ trace correlation (stage 2)."""

    trace_column: str = Field("trace_id", description="row column holding the writer's trace id, if the app has one")
    skew_ms: float = Field(5.0, ge=0, description="tolerated clock skew between database and application")
    max_commit_delay_ms: float = Field(2000.0, gt=0)
    wait_s: float = Field(
        20.0, gt=0, description="event time a row change waits for its trace before it stays uncorrelated"
    )
    history_per_entity: int = Field(64, ge=1)
    max_entities: int = Field(100_000, ge=1)
    max_pending_changes: int = Field(100_000, ge=1)


class CollisionConfig(_Section):
    """The collision detector (stage 2)."""

    window_s: float = Field(2.0, gt=0, description="causal window: how far apart two traces' statements may be")
    settle_s: float = Field(1.0, ge=0, description="extra event time to wait for row changes before judging")
    invariants: dict[str, list[str]] = Field(
        default_factory=dict, description='table -> SQL predicates on after-images, e.g. {inventory = ["stock >= 0"]}'
    )
    history_per_entity: int = Field(256, ge=2)
    max_entities: int = Field(100_000, ge=1)


class RegressionConfig(_Section):
    """Windowed service statistics and the regression detector (stage 1)."""

    reservoir_size: int = Field(256, ge=8, description="latency samples kept per (operation, version) per window")
    slow_traces: int = Field(32, ge=1, description="slowest requests per key per window whose critical path is kept")
    max_signatures: int = Field(64, ge=1, description="error signatures per key per window; the rest fold into (other)")
    baseline_windows: int = Field(10, ge=1, description="rolling baseline: how many previous windows")
    fdr: float = Field(0.05, gt=0, lt=1, description="Benjamini-Hochberg false discovery rate across operations")
    min_requests: int = Field(30, ge=1, description="requests per side before a count test runs")
    min_samples: int = Field(20, ge=3, description="latency samples per side before the rank test runs")
    min_latency_ratio: float = Field(1.2, ge=1, description="p50 or p95 must grow this much to be a latency regression")
    seed: int = 0


class ProofConfig(_Section):
    """Proof contracts and the proof judge (stage 1)."""

    settle_s: float = Field(30.0, ge=0, description="event time to wait for collisions (stage 2) before judging")
    slice_s: float = Field(1.0, gt=0, description="granularity of the judge's event-time slices")
    max_builds: int = Field(16, ge=2, description="builds kept per service")
    max_keys: int = Field(1024, ge=16, description="routes / error kinds / event names kept per build")
    watch_s: float = Field(3600.0, gt=0, description="how long a new build is watched for a verdict")


class ReproConfig(_Section):
    """The repro worker: deterministic repros (RED), repairs, and the GREEN proof."""

    enabled: bool = Field(False, description="run the repro worker (a consumer group on the incidents topic)")
    dsn: str = Field("", description="scratch PostgreSQL for repro runs (a database per run); default postgres_dsn")
    source_root: str = Field("", description="checkout of the service's code; empty = SQL-level repros only")
    copy_paths: list[str] = Field(default_factory=list, description="dirs under source_root copied for GREEN runs")
    source_map: dict[str, str] = Field(default_factory=dict, description="recorded path prefix -> local dir")
    call_specs: str = Field("", description='"module:NAME" of the CallSpecs for application-level repros')
    schema_sql: str = Field("", description="the tables' DDL for scratch databases (default: inferred from rows)")
    output_dir: str = Field("out/repros", description="where tests, JUnit XML and Code Quality reports go")


class GraphPolicyConfig(_Section):
    """Which spans become graph nodes (the rest feed aggregates only) and how long raw spans live."""

    detail: str = Field(
        "entities_or_errors",
        pattern="^(all|entities_or_errors|paths|none)$",
        description="all spans; every span of traces that touch rows or fail; only their DB/error spans and "
        "ancestors (paths); or none",
    )
    span_retention_s: float = Field(24 * 3600.0, gt=0, description="raw Span/Trace nodes older than this expire")


class GitLabConfig(_Section):
    """Where incidents are filed as GitLab issues (token: ``gitlab_token`` / TRACE_REPRO_GITLAB_TOKEN)."""

    url: str = Field("", description="GitLab base URL; empty = sink off")
    project: str = Field("", description='project path "group/name" or numeric id')
    labels: list[str] = Field(default_factory=lambda: ["trace-repro"], description="labels on every issue")
    timeout_s: float = Field(10.0, gt=0, description="per-request connect/read timeout")
    max_attempts: int = Field(5, ge=1, description="attempts per step on 429/5xx/timeouts/connection errors")
    backoff_s: float = Field(0.5, gt=0)
    max_backoff_s: float = Field(30.0, gt=0)
    max_retry_after_s: float = Field(
        120.0, ge=0, description="a longer Retry-After fails the flush at once (retryable)"
    )
    occurrence_notes: int = Field(5, ge=0, description="repeat occurrences that get a note; later ones only count")
    merge_requests: bool = Field(False, description="open a 'Proves #N' merge request for proven repros")
    target_branch: str = Field("", description="MR target; default: the project's default branch")
    ssl_verify: bool = True


class FileSinkConfig(_Section):
    """Output events appended to JSON-lines files, for users without a Kafka consumer downstream."""

    enabled: bool = False
    directory: str = "out/events"
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="rotate a file before it grows past this")
    keep: int = Field(5, ge=0, description="rotated files kept per kind")
    remember: int = Field(100_000, ge=1, description="event ids remembered per kind against replays")
    tail_bytes: int = Field(16 * 1024 * 1024, ge=0, description="bytes of existing files read on start to load ids")


class HttpConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535, description="/metrics, /healthz, /readyz; 0 = pick a free port")


class Settings(BaseSettings):
    """Everything the daemon reads at start."""

    model_config = SettingsConfigDict(env_prefix="TRACE_REPRO_", env_nested_delimiter="__", extra="forbid", frozen=True)

    environment: str = "local"
    kafka: KafkaConfig = KafkaConfig()
    falkordb: FalkorDBConfig = FalkorDBConfig()
    windows: WindowConfig = WindowConfig()
    graph_policy: GraphPolicyConfig = GraphPolicyConfig()
    decode: DecodeConfig = DecodeConfig()
    sql: SqlConfig = SqlConfig()
    correlation: CorrelationConfig = CorrelationConfig()
    collisions: CollisionConfig = CollisionConfig()
    regressions: RegressionConfig = RegressionConfig()
    proof: ProofConfig = ProofConfig()
    repro: ReproConfig = ReproConfig()
    http: HttpConfig = HttpConfig()
    postgres_dsn: str = ""
    gitlab: GitLabConfig = GitLabConfig()
    file_sink: FileSinkConfig = FileSinkConfig()
    gitlab_token: SecretStr | None = None

    @model_validator(mode="after")
    def _invariants_parse(self) -> Settings:
        from processors.invariants import InvariantError, compile_invariants

        try:
            compile_invariants(self.collisions.invariants)
        except InvariantError as exc:
            raise ValueError(f"collisions.invariants: {exc}") from exc
        return self

    @property
    def graph_name(self) -> str:
        return self.falkordb.graph or f"trace_repro_{self.environment}"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)


class ConfigError(ValueError):
    """A bad configuration; the message names the offending key."""


_ALIASES = {
    "TRACE_REPRO_KAFKA_BOOTSTRAP": ("kafka", "bootstrap"),
    "TRACE_REPRO_FALKORDB_URL": ("falkordb", "url"),
}


def load(path: Path | None = None, env: dict[str, str] | None = None) -> Settings:
    """Read ``path`` (TOML) and the environment into validated settings, or raise :class:`ConfigError`."""
    env = dict(os.environ if env is None else env)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    for var, (section, key) in _ALIASES.items():
        if var in env:
            data.setdefault(section, {})[key] = env.pop(var)
    if "TRACE_REPRO_POSTGRES_DSN" in env:
        data["postgres_dsn"] = env.pop("TRACE_REPRO_POSTGRES_DSN")
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in env.items() if not k.startswith("TRACE_REPRO_") or _is_setting(k)})
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _is_setting(var: str) -> bool:
    name = var.removeprefix("TRACE_REPRO_").lower().split("__", 1)[0]
    return name in Settings.model_fields


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f" in {path}" if path else ""
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        lines.append(f"  {key}: {err['msg']}")
    return "\n".join(lines)
