"""``[kafka]``: the bus: where to consume from, what the topics are called, how a broker outage is waited out."""

from __future__ import annotations

from pydantic import Field

from processors.component import Section


class KafkaConfig(Section):
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
    max_partition_fetch_bytes: int = Field(
        1024 * 1024,
        ge=1024,
        description="bytes per partition per fetch, so per batch: the memory bound of a batch (decoded spans take ten "
        "times their bytes); a larger message still comes, alone",
    )
    poll_timeout_ms: int = Field(200, ge=1)
    retry_backoff_s: float = Field(
        0.5,
        gt=0,
        description="while the broker is away: first delay before a send or a poll is tried again; "
        "doubles per attempt, with jitter",
    )
    max_retry_backoff_s: float = Field(10.0, gt=0, description="cap of that delay (the wait itself has no bound)")

    def topic(self, role: str) -> str:
        """The output topic of a role: incidents | repros | verdicts | contracts | dlq."""
        topics = {"incidents": self.incidents_topic, "repros": self.repros_topic, "verdicts": self.verdicts_topic,
                  "contracts": self.contracts_topic, "dlq": self.dlq_topic}  # fmt: skip
        try:
            return topics[role]
        except KeyError:
            raise ValueError(f"no output topic for role {role!r}") from None
