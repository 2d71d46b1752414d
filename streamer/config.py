"""The daemon's configuration: a TOML file plus ``TRACE_REPRO_*`` environment variables.

Precedence: environment > TOML file > defaults. Every section is frozen and rejects unknown keys, so a typo fails
at start with the key's dotted name. Nested keys come from the environment with ``__`` (for example
``TRACE_REPRO_KAFKA__GROUP_ID``); the engine addresses that ``trace-repro local up`` writes have short aliases
(``TRACE_REPRO_KAFKA_BOOTSTRAP``, ``TRACE_REPRO_FALKORDB_URL``, ``TRACE_REPRO_POSTGRES_DSN``).

The core sections (the bus, the graph, event time, decoding, SQL analysis, correlation, HTTP) are declared here;
every component's section (``[collisions]``, ``[gitlab]``, ...) comes from its own folder through the components
list, so the settings model is built from that list (:func:`settings_model`): a new component with a config is
one folder and one line in ``streamer.components``, and its section is validated like the others.
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, ValidationError, create_model, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from processors.api.component import Factory, Section
from processors.codeloc import CodeLocConfig
from processors.correlation.config import CorrelationConfig
from processors.graph.rows import GraphPolicyConfig
from processors.redaction import RedactionConfig
from processors.sql import SqlConfig
from processors.state.config import WindowConfig
from sinks.graph.config import FalkorDBConfig
from sinks.kafka.config import KafkaConfig
from streamer import config_names
from streamer.decode.config import DecodeConfig

C = TypeVar("C", bound=BaseModel)
MIN_POLL_WAIT_MS = 200  # the derived poll wait's bounds (CoreSettings.poll_timeout_ms)
MAX_POLL_WAIT_MS = 1000


class HttpConfig(Section):
    """The daemon's own HTTP endpoints."""

    host: str = Field("127.0.0.1", description="listen address")
    port: int = Field(9464, ge=0, le=65535, description="/metrics, /healthz, /readyz; 0 = pick a free port")
    max_service_labels: int = Field(
        200,
        ge=1,
        description="distinct `service` label values of the findings metrics; later services count as "
        "`other` (a drop service_label_overflow of component metrics)",
    )


class CoreSettings(BaseSettings):
    """The sections every daemon has; component sections are added by :func:`settings_model`."""

    model_config = SettingsConfigDict(env_prefix="TRACE_REPRO_", env_nested_delimiter="__", extra="forbid", frozen=True)

    environment: str = Field("local", description="the deployment's name: one FalkorDB graph per environment")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="the least severe log lines written (`trace-repro run --log-level` overrides it)"
    )
    workers: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        1, description="stage-1 worker processes of `trace-repro run` (one consumer group); auto = the cores"
    )
    kafka: KafkaConfig = KafkaConfig()
    falkordb: FalkorDBConfig = FalkorDBConfig()
    windows: WindowConfig = WindowConfig()
    graph_policy: GraphPolicyConfig = GraphPolicyConfig()
    decode: DecodeConfig = DecodeConfig()
    sql: SqlConfig = SqlConfig()
    correlation: CorrelationConfig = CorrelationConfig()
    codeloc: CodeLocConfig = CodeLocConfig()
    http: HttpConfig = HttpConfig()
    redaction: RedactionConfig = RedactionConfig()
    unknown_env: Literal["refuse", "warn"] = Field(
        "refuse", description="a TRACE_REPRO_* name nothing reads (a typo): refuse to start (exit 2), or warn and run"
    )
    postgres_dsn: str = Field(
        "", description="PostgreSQL for the repro worker's scratch databases when repro.dsn is empty"
    )
    gitlab_token: SecretStr | None = Field(
        None, description="GitLab API token of the GitLab sink: set it in the environment (or use gitlab.token_file)"
    )
    redaction_key: SecretStr | None = Field(
        None, description="HMAC key of [redaction]'s hash rules: set it in the environment"
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _hash_needs_a_key(self) -> CoreSettings:
        if self.redaction.enabled and self.redaction.hashes() and not self.redaction_key:
            raise ValueError("redaction: a rule says hash but redaction_key (TRACE_REPRO_REDACTION_KEY) is not set")
        return self

    @property
    def graph_name(self) -> str:
        return self.falkordb.graph or f"trace_repro_{self.environment}"

    @property
    def poll_timeout_ms(self) -> int:
        """How long a poll waits when no record comes: ``kafka.poll_timeout_ms``, else a fifth of ``windows.idle_s``
        within 200-1000 ms (an idle stage's clock-driven work, idleness first, is then late by at most a fifth of
        ``idle_s``). A record that comes ends the wait, however long it is."""
        if self.kafka.poll_timeout_ms is not None:
            return self.kafka.poll_timeout_ms
        return round(min(MAX_POLL_WAIT_MS, max(MIN_POLL_WAIT_MS, self.windows.idle_s * 1000 / 5)))

    def section(self, name: str, model: type[C]) -> C:
        """The section ``name``, checked to be a ``model`` (component sections have no static attribute)."""
        value = getattr(self, name, None)
        if not isinstance(value, model):
            raise KeyError(f"no config section {name!r} of type {model.__name__}")
        return value

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


Settings = CoreSettings  # the type the runtime is written against; instances come from settings_model(...)


@functools.cache
def _model(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[CoreSettings]:
    fields: dict[str, Any] = {name: (model, model()) for name, model in sections}
    return create_model("Settings", __base__=CoreSettings, **fields)


def settings_model(factories: Sequence[Factory[Any, Any]] | None = None) -> type[CoreSettings]:
    """The settings model with a section per component factory (default: ``streamer.components.default()``)."""
    if factories is None:
        from streamer.components import default

        factories = default().factories
    sections: dict[str, type[BaseModel]] = {}
    for f in factories:
        name = f.config_section
        if name in CoreSettings.model_fields:
            continue  # a component configured by a core section
        known = sections.setdefault(name, f.config)
        if known is not f.config:
            raise ValueError(f"config section [{name}] is claimed by two components")
    return _model(tuple(sorted(sections.items())))


class ConfigError(ValueError):
    """A bad configuration; the message names the offending key."""


_ALIASES = {
    "TRACE_REPRO_KAFKA_BOOTSTRAP": ("kafka", "bootstrap"),
    "TRACE_REPRO_FALKORDB_URL": ("falkordb", "url"),
}
_ENV_ONLY = {("kafka", "sasl_password"), ("kafka", "ssl_key_password")}  # secrets: never in a file


def load(
    path: Path | None = None, env: dict[str, str] | None = None, factories: Sequence[Factory[Any, Any]] | None = None
) -> CoreSettings:
    """Read ``path`` (TOML) and the environment into validated settings, or raise :class:`ConfigError`."""
    model = settings_model(factories)
    env = dict(os.environ if env is None else env)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
        for section, key in sorted(_ENV_ONLY):
            if key in data.get(section, {}):
                raise ConfigError(f"{path}: {section}.{key} is a secret: set it in the environment "
                                  f"(TRACE_REPRO_{section.upper()}__{key.upper()}), not in a file")  # fmt: skip
    for var, (section, key) in _ALIASES.items():
        if var in env:
            data.setdefault(section, {})[key] = env.pop(var)
    if "TRACE_REPRO_POSTGRES_DSN" in env:
        data["postgres_dsn"] = env.pop("TRACE_REPRO_POSTGRES_DSN")
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in env.items() if not k.startswith("TRACE_REPRO_") or _is_setting(k, model)})
        return model(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, model)) from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _is_setting(var: str, model: type[CoreSettings]) -> bool:
    name = var.removeprefix("TRACE_REPRO_").lower().split("__", 1)[0]
    return name in model.model_fields


def _describe(exc: ValidationError, path: Path | None, model: type[CoreSettings]) -> str:
    """One line per refused key; an unknown key (a typo) also names the closest valid one."""
    where = f" in {path}" if path else ""
    lines = [f"invalid configuration{where}:"]
    valid = config_names.keys(model)
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(root)"
        near = config_names.closest(key, valid) if err["type"] == "extra_forbidden" else None
        lines.append(f"  {key}: {err['msg']}" + (f"; did you mean {near}?" if near else ""))
    return "\n".join(lines)
