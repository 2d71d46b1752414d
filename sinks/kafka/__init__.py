"""The Kafka sink: the daemon's one idempotent producer."""

from sinks.kafka.config import KafkaConfig
from sinks.kafka.message import Message
from sinks.kafka.producer import KafkaSink, ProduceAborted

__all__ = ["KafkaConfig", "KafkaSink", "Message", "ProduceAborted"]
