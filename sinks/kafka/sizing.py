"""How big a message may be on a topic, and a dead letter cut to fit.

The broker refuses a record batch larger than its topic's ``max.message.bytes`` (``MessageSizeTooLargeError``) and
the producer one larger than its ``max_request_size``. :class:`Limits` learns each topic's limit from the broker
(``describe_configs``), so that the producer builds no batch beyond it and fits each message before sending.
:func:`trimmed` cuts a dead letter to a limit: its value (and, if it must, its key) shortened, with headers that say
so; :func:`redirected` turns any other message that its topic cannot take into a dead letter; :class:`Fitter` does
both to every message the Kafka sink sends.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable

import structlog
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from processors.api.telemetry import Telemetry
from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig
from sinks.kafka.message import Message

log = structlog.get_logger("trace_repro.kafka")

BROKER_DEFAULT = 1_048_588  # Kafka's default message.max.bytes: the limit of a topic whose config cannot be read
DESCRIBE_TIMEOUT_S = 10.0
TRUNCATED = "truncated"  # header: the original value's size in bytes, on a message whose value was cut
TRUNCATED_KEY = "truncated.key"  # header: the original key's size, when the key had to go too
DIGEST = "original.sha256"  # header: the SHA-256 of the original value (hex), on a message whose value was cut


def size(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes]]) -> int:
    """Bytes of a record batch holding this one record (what ``max.message.bytes`` is compared with)."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, list(headers)))


def message_size(m: Message) -> int:
    return size(m.key, m.value, m.headers)


def trimmed(m: Message, limit: int) -> Message | None:
    """``m`` cut to at most ``limit`` bytes: its value's head, ``truncated`` and ``original.sha256`` headers, and,
    if even that is too large, no key (``truncated.key``); None when its headers alone exceed the limit."""
    value = m.value or b""
    headers = (*m.headers, (TRUNCATED, str(len(value)).encode()), (DIGEST, hashlib.sha256(value).hexdigest().encode()))
    key = m.key
    if key is not None and size(key, b"", headers) > limit:
        headers = (*headers, (TRUNCATED_KEY, str(len(key)).encode()))
        key = None
    room = limit - size(key, b"", headers)
    if room < 0:
        return None
    keep = min(room, len(value))
    while keep > 0 and size(key, value[:keep], headers) > limit:  # the value's length varint grew
        keep -= 1
    return Message(m.topic, key, value[:keep], headers, m.partition)


def redirected(m: Message, dlq_topic: str, reason: str, error: str) -> Message:
    """The dead letter of an output message that its topic cannot take (too large, refused): the message itself
    (to be fitted to the dead-letter topic's limit) with the reason and the topic it was meant for."""
    headers = (
        *m.headers,
        ("reason", reason.encode()),
        ("error", error[:1000].encode("utf-8", "replace")),
        ("source.topic", m.topic.encode("utf-8", "replace")),
    )
    return Message(dlq_topic, m.key, m.value, headers)


class Limits:
    """The largest record batch each topic takes: its ``max.message.bytes``, never above the producer's own
    ``max_request_size``; :data:`BROKER_DEFAULT` for a topic whose config could not be read (read again after a
    size refusal, see :meth:`refused`)."""

    def __init__(self, config: KafkaConfig, max_request_size: int) -> None:
        self.config = config
        self.max_request_size = max_request_size
        self._bytes: dict[str, int] = {}

    def known(self, topic: str) -> bool:
        return topic in self._bytes

    def __getitem__(self, topic: str) -> int:
        return self._bytes.get(topic, min(BROKER_DEFAULT, self.max_request_size))

    async def learn(self, topics: Iterable[str]) -> None:
        """Read ``max.message.bytes`` of ``topics`` from the broker; a topic it cannot tell about gets the default
        (a failure is logged, never raised: the broker may be away)."""
        wanted = sorted(set(topics))
        if not wanted:
            return
        for topic in wanted:
            self._bytes.setdefault(topic, min(BROKER_DEFAULT, self.max_request_size))
        admin = AIOKafkaAdminClient(**client_kwargs(self.config, "admin"),
                                    request_timeout_ms=int(DESCRIBE_TIMEOUT_S * 1000))  # fmt: skip
        try:
            await asyncio.wait_for(admin.start(), DESCRIBE_TIMEOUT_S)
            resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in wanted]
            responses = await asyncio.wait_for(admin.describe_configs(resources), DESCRIBE_TIMEOUT_S)
        except (KafkaError, TimeoutError, OSError) as exc:
            log.warning("kafka.limits_unknown", topics=wanted, error=type(exc).__name__)
            return
        finally:
            await admin.close()
        for response in responses:
            for resource in response.resources:
                error_code, name, entries = resource[0], resource[3], resource[4]
                if error_code:
                    continue
                for entry in entries:
                    if entry[0] == "max.message.bytes" and entry[1] is not None:
                        self._bytes[name] = min(int(entry[1]), self.max_request_size)
        log.info("kafka.limits", **{t: self._bytes[t] for t in wanted})

    async def refused(self, topic: str, nbytes: int) -> None:
        """The broker refused a single record of ``nbytes`` for its size: read the topic's limit again, and assume
        at most half of what was refused (so that fitting again converges whatever the broker's real limit)."""
        await self.learn([topic])
        self._bytes[topic] = min(self._bytes[topic], nbytes // 2)


class Fitter:
    """Fits messages to their topics' limits before they are sent (see :mod:`sinks.kafka.producer`): a dead letter
    too large is trimmed (``trimmed``), any other message too large is dead-lettered (``dropped{reason="too_large"}``)
    and trimmed in turn if it must; a message the broker refused for its content is dead-lettered too
    (``dropped{reason="refused:<error>"}``), a dead letter refused is dropped."""

    def __init__(self, limits: Limits, dlq_topic: str, telemetry: Telemetry) -> None:
        self.limits = limits
        self.dlq_topic = dlq_topic
        self.telemetry = telemetry

    async def fitted(self, messages: Iterable[Message]) -> list[Message]:
        """``messages`` fitted to their topics' limits (each topic's limit read on its first use), in order."""
        out = []
        for m in messages:
            if not self.limits.known(m.topic):
                await self.limits.learn([m.topic])
            fitted = await self._fit(m)
            if fitted is not None:
                out.append(fitted)
        return out

    async def _fit(self, m: Message) -> Message | None:
        limit = self.limits[m.topic]
        if message_size(m) <= limit:
            return m
        dlq = self.dlq_topic
        if m.topic != dlq:
            self.telemetry.drop("too_large")
            log.warning("kafka.too_large", topic=m.topic, bytes=message_size(m), limit=limit)
            if not self.limits.known(dlq):
                await self.limits.learn([dlq])
            m = redirected(m, dlq, "too_large", f"{message_size(m)} bytes, over the {limit} bytes {m.topic} takes")
            limit = self.limits[dlq]
            if message_size(m) <= limit:
                return m
        cut = trimmed(m, limit)
        if cut is None:
            self.telemetry.drop("dead_letter_too_large")
            log.error("kafka.dead_letter_too_large", topic=m.topic, limit=limit)
            return None
        self.telemetry.count("trimmed")
        return cut

    def refused(self, m: Message, exc: BaseException) -> list[Message]:
        """A message the broker refused for its content: its dead letter (none for a dead letter), counted."""
        reason = f"refused:{type(exc).__name__}"
        self.telemetry.drop(reason)
        log.warning("kafka.refused", topic=m.topic, error=type(exc).__name__)
        if m.topic == self.dlq_topic:
            return []
        return [redirected(m, self.dlq_topic, reason, f"{m.topic} refused it: {type(exc).__name__}")]
