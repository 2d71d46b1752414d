"""``[decode]``: which span attributes carry application facts, and how much of an attribute is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from processors.api.component import Section


class SchemaRegistryConfig(Section):
    """``[decode.schema_registry]``: where the schemas of Avro row changes are (Debezium with a registry converter).

    A Debezium message whose key or value starts with the magic byte 0 is Avro in the registry's framing; without a
    ``url`` it is dead-lettered (``avro_no_registry``). Credentials come from the environment
    (``TRACE_REPRO_DECODE__SCHEMA_REGISTRY__PASSWORD``, ``..._BEARER_TOKEN``) and are never logged."""

    url: str = Field(
        "",
        pattern=r"^(https?://\S+)?$",
        description="the registry's API root: Confluent SR, Karapace, Redpanda (http://host:8081), Apicurio's "
        "Confluent-compatible API (http://host:8080/apis/ccompat/v7) or, with wire=apicurio, its native API "
        "(http://host:8080/apis/registry/v2); empty: no registry",
    )
    wire: Literal["confluent", "apicurio"] = Field(
        "confluent",
        description="the framing: confluent (magic byte 0, 4-byte schema id, GET {url}/schemas/ids/{id}: what "
        "Confluent's and Apicurio's converter with apicurio.registry.as-confluent=true write) or apicurio (magic "
        "byte 0, 8-byte global id, GET {url}/ids/globalIds/{id}: Apicurio's converter with headers disabled)",
    )
    username: str = Field("", description="basic-auth user (with password)")
    password: SecretStr | None = Field(None, description="basic-auth password")
    bearer_token: SecretStr | None = Field(None, description="a bearer token, sent instead of basic auth")
    ca_file: Path | None = Field(None, description="CA bundle for an https registry (default: the system's CAs)")
    timeout_s: float = Field(10.0, gt=0, description="one schema request's timeout")
    max_schemas: int = Field(
        1024, ge=1, description="parsed schemas kept; evicting one is counted (schema_cache) and refetched if needed"
    )
    retry_backoff_s: float = Field(0.5, gt=0, description="first delay before asking a registry that is away again")
    max_retry_backoff_s: float = Field(30.0, gt=0, description="longest such delay (jittered, doubling)")


class DecodeConfig(Section):
    """Which span attributes carry application facts, and how much of an attribute we keep."""

    tx_id_attribute: str = Field("db.transaction.id", description="span attribute holding the DB transaction id")
    row_version_attribute: str = Field("db.row.version", description="span attribute holding the row version read")
    idempotency_key_attribute: str = Field(
        "app.idempotency_key", description="span attribute holding the request's idempotency key"
    )
    max_attribute_bytes: int = Field(
        65_536, ge=64, description="a span attribute or a row value (as JSON) longer than this is oversize"
    )
    oversize: str = Field(
        "truncate",
        pattern="^(dlq|truncate)$",
        description="an oversize span attribute: truncate (cut, counted as truncated_attributes; the message's other "
        "traces and the span are kept) or dlq (the whole message, every trace in it, to the DLQ); an oversize row "
        "value is always replaced by Debezium's unavailable-value placeholder and counted (oversize_values)",
    )
    max_shared_strings: int = Field(
        16_384, ge=1, description="distinct strings (statements, tables, code locations) stage 2's accesses share"
    )
    schema_registry: SchemaRegistryConfig = SchemaRegistryConfig()
