"""Decoders as components, and the inputs that bind them to topics.

A *decoder* turns one Kafka message into typed events of one *signal*: ``spans`` (OTLP traces), ``logs`` (OTLP
logs), ``row_changes`` (Debezium), ``events`` (trace-repro's own output events: incidents, contracts) or
``internal`` (the stage-1 -> stage-2 topic). Decoders are registered by name (``otlp_proto.traces``,
``debezium``, ...); a stage declares its :class:`Input` s, each a topic (or a topic pattern) with the decoder
config names for it (``kafka.span_encoding`` picks ``otlp_proto`` or ``otlp_json``), so a stage never dispatches
on topic names: it looks the record's topic up once (cached) and hands the events to the handler of the input's
signal. Every decoder raises :class:`~streamer.decode.errors.DecodeError` with a short reason for a message it
cannot decode; anything else it raises is a bug, caught by the stage and dead-lettered as ``internal_error``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.outputs import parse_event
from streamer.decode.config import DecodeConfig
from streamer.decode.debezium import ChangeStats, decode_row_change
from streamer.decode.errors import DecodeError
from streamer.decode.internal import decode_all as decode_internal
from streamer.decode.jsontext import loads
from streamer.decode.otlp import (
    DecodeOptions,
    DecodeStats,
    decode_logs_json,
    decode_logs_proto,
    decode_traces_json,
    decode_traces_proto,
    shared_resets,
)
from streamer.decode.schema_registry import SchemaRegistry
from streamer.decode.strings import SharedStrings


@dataclass(frozen=True, slots=True)
class Record:
    """One consumed Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = 0
    headers: tuple[tuple[str, bytes], ...] = ()  # as the producer set them (kept on its dead letter)

    @property
    def source(self) -> tuple[tuple[str, int], int]:
        """Its position: ((topic, partition), offset)."""
        return ((self.topic, self.partition), self.offset)


Decode = Callable[[Record], Sequence[Any]]
DecoderFactory = Callable[[DecodeConfig, Telemetry], Decode]


def _options(config: DecodeConfig) -> DecodeOptions:
    return DecodeOptions(
        tx_id_attribute=config.tx_id_attribute,
        row_version_attribute=config.row_version_attribute,
        idempotency_key_attribute=config.idempotency_key_attribute,
        max_attribute_bytes=config.max_attribute_bytes,
    )


class _Traces:
    """A traces decoder (protobuf or JSON). The shared-value caches' resets (theirs are process-wide; a detail read
    after its message was decoded may reset one) are counted once a batch, at :meth:`batch_done`."""

    def __init__(self, decode: Callable[..., Any], config: DecodeConfig, telemetry: Telemetry) -> None:
        self.decode, self.config, self.telemetry = decode, config, telemetry
        self.options = _options(config)
        telemetry.declare("truncated_attributes", "unreadable_spans", "shared_cache_reset")
        self.resets = shared_resets()  # seen so far
        self.stats = DecodeStats()  # every message's, added up: a message's are the difference (no object each)

    def __call__(self, record: Record) -> Sequence[Any]:
        if not record.value:
            raise DecodeError("empty_value", "span message has no value")
        stats = self.stats
        truncated, unreadable = stats.truncated_attributes, stats.unreadable_spans
        out = self.decode(record.value, self.options, stats)
        truncated, unreadable = stats.truncated_attributes - truncated, stats.unreadable_spans - unreadable
        telemetry = self.telemetry
        if truncated:
            if self.config.oversize == "dlq":
                raise DecodeError("oversize_attribute", f"{truncated} attribute(s) over "
                                  f"{self.options.max_attribute_bytes} bytes")  # fmt: skip
            telemetry.drop("truncated_attributes", truncated)
        if unreadable:
            telemetry.drop("unreadable_spans", unreadable)
        telemetry.count("spans", len(out))
        return out  # type: ignore[no-any-return]

    def batch_done(self) -> None:
        now = shared_resets()
        if now != self.resets:
            self.telemetry.drop("shared_cache_reset", now - self.resets)
            self.resets = now


def _traces(decode: Callable[..., Any]) -> DecoderFactory:
    return lambda config, telemetry: _Traces(decode, config, telemetry)


def _logs(decode: Callable[..., Any]) -> DecoderFactory:
    def factory(config: DecodeConfig, telemetry: Telemetry) -> Decode:
        options = _options(config)

        def logs(record: Record) -> Sequence[Any]:
            if not record.value:
                raise DecodeError("empty_value", "log message has no value")
            out = decode(record.value, options, None)
            telemetry.count("logs", len(out))
            return out  # type: ignore[no-any-return]

        return logs

    return factory


class _Debezium:
    """The Debezium decoder, JSON or Avro; with ``decode.schema_registry.url`` set, :meth:`prepare` fetches the
    schemas a batch's Avro messages name before it is decoded."""

    def __init__(self, config: DecodeConfig, telemetry: Telemetry) -> None:
        telemetry.declare("oversize_values")
        self.limit = config.max_attribute_bytes
        self.telemetry = telemetry
        registry = config.schema_registry
        self.registry = SchemaRegistry(registry, telemetry) if registry.url else None

    async def prepare(self, records: Sequence[Record]) -> None:
        if self.registry is not None:
            await self.registry.prepare(data for r in records for data in (r.key, r.value))

    def __call__(self, record: Record) -> Sequence[Any]:
        stats, telemetry = ChangeStats(), self.telemetry
        change = decode_row_change(record.key, record.value, topic=record.topic, partition=record.partition,
                                   offset=record.offset, max_value_bytes=self.limit, stats=stats,
                                   registry=self.registry)  # fmt: skip
        telemetry.drop("oversize_values", stats.oversize_values)
        telemetry.count("schemaless_changes", stats.schemaless)  # a precise decimal's scale was not in the message
        telemetry.count("unwrapped_changes", stats.unwrapped)  # no before-image of an update
        telemetry.count("heartbeats", stats.heartbeats)
        telemetry.count("transaction_events", stats.transactions)
        if not (stats.heartbeats or stats.transactions):
            telemetry.count("tombstones" if change is None else "row_changes")
        return () if change is None else (change,)


def _events(config: DecodeConfig, telemetry: Telemetry) -> Decode:
    def events(record: Record) -> Sequence[Published]:
        if record.value:
            loads(record.value, "event_invalid", "event")  # refuse lone surrogates before pydantic sees them
        try:
            event = parse_event(record.value)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise DecodeError("event_invalid", str(exc)[:500]) from exc
        if event is None:
            telemetry.count("unknown_kinds")  # a newer producer's kind: not ours to judge
            return ()
        return (event,)

    return events


def _internal(config: DecodeConfig, telemetry: Telemetry) -> Decode:
    shared = SharedStrings(config.max_shared_strings, telemetry)

    def internal(record: Record) -> Sequence[Any]:
        try:
            return decode_internal(record.value or b"", shared)
        except (ValueError, KeyError, TypeError) as exc:
            raise DecodeError("internal_invalid", str(exc)[:500]) from exc

    return internal


DECODERS: dict[str, DecoderFactory] = {
    "otlp_proto.traces": _traces(decode_traces_proto),
    "otlp_json.traces": _traces(decode_traces_json),
    "otlp_proto.logs": _logs(decode_logs_proto),
    "otlp_json.logs": _logs(decode_logs_json),
    "debezium": _Debezium,
    "events": _events,
    "internal": _internal,
}


@dataclass(frozen=True, slots=True)
class Input:
    """A topic (exact name) or topic pattern (regex), the signal it carries and the decoder for it."""

    signal: str
    decoder: str
    topics: tuple[str, ...] = ()
    pattern: str = ""


class Inputs:
    """A stage's inputs with their decoders built; the subscription pattern and the per-topic lookup."""

    def __init__(self, inputs: Sequence[Input], config: DecodeConfig, telemetry: Callable[[str], Telemetry]) -> None:
        unknown = sorted({i.decoder for i in inputs} - set(DECODERS))
        if unknown:
            raise ValueError(f"unknown decoder(s) {unknown}; known: {sorted(DECODERS)}")
        self.inputs = tuple(inputs)
        self._decode = {i.decoder: DECODERS[i.decoder](config, telemetry(f"decode.{i.decoder}")) for i in inputs}
        # The decoders that need something fetched before a batch (a schema registry's schemas): none, unless one
        # is configured, and then the batch is not walked at all.
        self._preparing = {name for name, d in self._decode.items() if getattr(d, "registry", None) is not None}
        self._batch_done = [done for d in self._decode.values() if (done := getattr(d, "batch_done", None))]
        self._patterns = [(re.compile(i.pattern), i) for i in inputs if i.pattern]
        self._by_topic: dict[str, Input | None] = {t: i for i in inputs for t in i.topics}

    @property
    def pattern(self) -> str:
        """The regex a consumer subscribes with: every exact topic and every pattern."""
        exact = "|".join(re.escape(t) for i in self.inputs for t in i.topics)
        parts = ([f"^(?:{exact})$"] if exact else []) + [i.pattern for i in self.inputs if i.pattern]
        return "|".join(parts)

    def lookup(self, topic: str) -> Input | None:
        """The input a topic belongs to (None: subscribed by pattern but not ours), cached per topic."""
        try:
            return self._by_topic[topic]
        except KeyError:
            found = next((i for rx, i in self._patterns if rx.search(topic)), None)
            self._by_topic[topic] = found
            return found

    def decode(self, source: Input, record: Record) -> Sequence[Any]:
        return self._decode[source.decoder](record)

    def batch_done(self) -> None:
        """After a batch's records: what a decoder counts once a batch."""
        for done in self._batch_done:
            done()

    async def prepare(self, records: Sequence[Record]) -> None:
        """Before a batch is decoded: what its decoders need from other services (a schema registry's schemas);
        raises :class:`~streamer.decode.errors.DecodeUnavailable` while one is away."""
        if not self._preparing:
            return
        wanted: dict[str, list[Record]] = {}
        for record in records:
            source = self.lookup(record.topic)
            if source is not None and source.decoder in self._preparing:
                wanted.setdefault(source.decoder, []).append(record)
        for decoder, batch in wanted.items():
            await self._decode[decoder].prepare(batch)  # type: ignore[attr-defined]
