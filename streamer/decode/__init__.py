"""Decoders: Kafka message values (OTLP protobuf/JSON, Debezium JSON) → typed events."""

from streamer.decode.debezium import decode_row_change
from streamer.decode.errors import DecodeError
from streamer.decode.otlp import (
    DecodeOptions,
    DecodeStats,
    decode_logs_json,
    decode_logs_proto,
    decode_traces_json,
    decode_traces_proto,
)

__all__ = [
    "DecodeError",
    "DecodeOptions",
    "DecodeStats",
    "decode_logs_json",
    "decode_logs_proto",
    "decode_row_change",
    "decode_traces_json",
    "decode_traces_proto",
]
