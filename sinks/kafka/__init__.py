"""The Kafka sink: the daemon's one idempotent producer."""

from sinks.kafka.config import KafkaConfig
from sinks.kafka.producer import KafkaSink, Message

__all__ = ["KafkaConfig", "KafkaSink", "Message"]
