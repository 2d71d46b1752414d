"""Decoders: Kafka message values (OTLP protobuf/JSON, Debezium JSON, our own events) -> typed events."""

from streamer.decode.config import DecodeConfig
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
from streamer.decode.registry import DECODERS, Input, Inputs, Record

__all__ = [
    "DECODERS",
    "DecodeConfig",
    "DecodeError",
    "DecodeOptions",
    "DecodeStats",
    "Input",
    "Inputs",
    "Record",
    "decode_logs_json",
    "decode_logs_proto",
    "decode_row_change",
    "decode_traces_json",
    "decode_traces_proto",
]
