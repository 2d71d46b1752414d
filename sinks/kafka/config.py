"""``[kafka]``: the bus: where to consume from, what the topics are called, how a broker outage is waited out, how
the clients reach a secured cluster (TLS, SASL) and which topics the daemon may create.

Every consumer, producer and admin client is built from this section by :func:`sinks.kafka.client.client_kwargs`.
The two secrets (``sasl_password``, ``ssl_key_password``) come from the environment only
(``TRACE_REPRO_KAFKA__SASL_PASSWORD``, ``TRACE_REPRO_KAFKA__SSL_KEY_PASSWORD``): a config file holding one is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from processors.api.component import Section


class KafkaConfig(Section):
    """Where to consume from and what to call things on the bus."""

    bootstrap: str = Field("127.0.0.1:9092", description="bootstrap servers, comma-separated")
    group_id: str = Field("trace-repro", description="consumer group of stage 1 (stage 2 appends '.entities')")
    spans_topic: str = Field(
        "otlp_spans", description="OTLP TracesData, as the OpenTelemetry Collector's kafka exporter writes"
    )
    logs_topic: str = Field(
        "otlp_logs", description="OTLP LogsData, as the OpenTelemetry Collector's kafka exporter writes"
    )
    cdc_pattern: str = Field(
        r"^shop\.[^.]+\.[^.]+$",
        description="regex matching the Debezium topics to read (<topic.prefix>.<schema>.<table>; the default "
        "matches `trace-repro local` captures)",
    )
    span_encoding: str = Field(
        "otlp_proto", pattern="^(otlp_proto|otlp_json)$", description="the exporter's encoding: otlp_proto or otlp_json"
    )
    accesses_topic: str = Field(
        "trace-repro.accesses",
        description="internal stage-1 -> stage-2 topic, partitioned by entity: row changes keyed by it, a batch's "
        "accesses packed into one message per partition",
    )
    accesses_partitions: int = Field(6, ge=1, description="partitions of the internal topic when we create it")
    accesses_message_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="a packed accesses message of the internal topic holds at most this many bytes (an access "
        "larger than that goes alone); keep it under the topic's max.message.bytes",
    )
    incidents_topic: str = Field("trace-repro.incidents", description="output: incidents and regressions")
    repros_topic: str = Field("trace-repro.repros", description="output: repros (RED/GREEN, the patch)")
    verdicts_topic: str = Field("trace-repro.verdicts", description="output: proof verdicts with their receipts")
    contracts_topic: str = Field("trace-repro.contracts", description="proof contracts added by CLI or other tools")
    dlq_topic: str = Field("trace-repro.dlq", description="dead letters: refused input, original bytes, reason")
    max_poll_records: int = Field(
        10_000,
        ge=1,
        description="messages per getmany() at most: above what a fetch brings of small messages, so that the bytes "
        "bound a batch and one-trace messages (a Collector's kafka exporter) are not cut into many small batches, "
        "each of which costs its graph statements",
    )
    fetch_max_bytes: int = Field(50 * 1024 * 1024, ge=1024, description="bytes per fetch response, all partitions")
    max_partition_fetch_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="bytes per partition per fetch, so per batch: the memory bound of a batch (decoded spans take ten "
        "times their bytes); a larger message still comes, alone",
    )
    poll_timeout_ms: int | None = Field(
        None,
        ge=1,
        description="longest wait of one poll when no record comes: how often an idle stage moves event time on by "
        "the clock; none = a fifth of windows.idle_s, within 200-1000 ms (1000 with the shipped windows: an idle "
        "daemon wakes five times less than at 200)",
    )
    retry_backoff_s: float = Field(
        0.5,
        gt=0,
        description="while the broker is away: first delay before a send or a poll is tried again; "
        "doubles per attempt, with jitter",
    )
    max_retry_backoff_s: float = Field(10.0, gt=0, description="cap of that delay (the wait itself has no bound)")
    auto_offset_reset: Literal["latest", "earliest"] = Field(
        "latest",
        description="where a new stage-1 group (a first start: no committed offset on any input partition) starts on "
        "the spans, logs and CDC topics: latest = what is produced from now on, earliest = everything they retain. "
        "Later, a partition without a committed offset (a topic created since, such as a new table's) is read from "
        "its beginning, and so are the daemon's own topics (internal, outputs) always",
    )
    client_id: str = Field("trace-repro", description="client id prefix; each client appends its role (-ingest, "
                           "-entities, -sink-<name>, -producer, -admin)")  # fmt: skip
    compression_type: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "none", description="codec of the record batches the daemon produces (every codec is read whatever this is)"
    )
    # ---- security (PLAINTEXT by default) ----
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="of every consumer, producer and admin client"
    )
    ssl_cafile: Path | None = Field(None, description="CA bundle (PEM) the brokers' certificates are checked against; "
                                    "none = the system's")  # fmt: skip
    ssl_certfile: Path | None = Field(None, description="client certificate (PEM), for brokers that require one")
    ssl_keyfile: Path | None = Field(None, description="its private key (PEM); with ssl_certfile")
    ssl_key_password: SecretStr | None = Field(
        None, description="the key's password: environment only (TRACE_REPRO_KAFKA__SSL_KEY_PASSWORD)"
    )
    ssl_check_hostname: bool = Field(True, description="check the broker's certificate names the host connected to")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] = Field(
        "PLAIN", description="with SASL_PLAINTEXT or SASL_SSL"
    )
    sasl_username: str = Field("", description="PLAIN and SCRAM user (the password: sasl_password)")
    sasl_password: SecretStr | None = Field(None, description="environment only (TRACE_REPRO_KAFKA__SASL_PASSWORD)")
    sasl_oauth_token_file: Path | None = Field(
        None,
        description="OAUTHBEARER: a file holding the token, read again at every authentication (a sidecar "
        "refreshes it)",
    )
    sasl_oauth_token_command: str = Field(
        "",
        description="OAUTHBEARER: a command (no shell) whose standard output is the token, run at every "
        "authentication; instead of sasl_oauth_token_file",
    )
    # ---- the topics the daemon creates: the internal one, the outputs, the dead letters ----
    create_topics: bool = Field(
        True, description="create them when missing; false = they must exist (the platform team's), checked at start"
    )
    replication_factor: int = Field(1, ge=1, description="of the topics the daemon creates")
    topic_partitions: int = Field(1, ge=1, description="of the output and dead-letter topics the daemon creates")
    retention_ms: int | None = Field(
        None, ge=-1, description="retention.ms of the topics the daemon creates; none = the broker's default"
    )

    @model_validator(mode="after")
    def _security(self) -> KafkaConfig:
        """A SASL or TLS setting that cannot work fails at start, naming the key."""
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism == "OAUTHBEARER":
            if (self.sasl_oauth_token_file is None) == (not self.sasl_oauth_token_command):
                raise ValueError("sasl_mechanism OAUTHBEARER needs one of sasl_oauth_token_file, "
                                 "sasl_oauth_token_command")  # fmt: skip
        elif sasl and (not self.sasl_username or self.sasl_password is None):
            raise ValueError(f"security_protocol {self.security_protocol} needs sasl_username and sasl_password "
                             "(TRACE_REPRO_KAFKA__SASL_PASSWORD)")  # fmt: skip
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together")
        return self

    def own_topics(self) -> dict[str, int]:
        """The topics the daemon creates (or, with ``create_topics = false``, expects), with their partitions."""
        out = dict.fromkeys([self.dlq_topic, self.incidents_topic, self.repros_topic, self.verdicts_topic],
                            self.topic_partitions)  # fmt: skip
        return {self.accesses_topic: self.accesses_partitions, **out}

    def topic(self, role: str) -> str:
        """The output topic of a role: incidents | repros | verdicts | contracts | dlq."""
        topics = {"incidents": self.incidents_topic, "repros": self.repros_topic, "verdicts": self.verdicts_topic,
                  "contracts": self.contracts_topic, "dlq": self.dlq_topic}  # fmt: skip
        try:
            return topics[role]
        except KeyError:
            raise ValueError(f"no output topic for role {role!r}") from None
