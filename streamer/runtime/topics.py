"""Creating Kafka topics that do not exist yet (the daemon's own topics; bench and test topics), or, when the platform
team creates them (``kafka.create_topics = false``), checking that they exist."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from sinks.kafka.client import client_kwargs
from sinks.kafka.config import KafkaConfig


class MissingTopics(RuntimeError):
    """``kafka.create_topics = false`` and some of the daemon's topics do not exist."""


async def create_topics(bootstrap: str | KafkaConfig, partitions: Mapping[str, int], *, replication_factor: int = 1,
                        configs: Mapping[str, str] | None = None) -> list[str]:  # fmt: skip
    """Create every topic of ``{name: partitions}`` that is missing (with ``replication_factor`` and the topic
    ``configs``); returns those created. ``bootstrap`` is the brokers, or the ``[kafka]`` section (its security).

    Idempotent and race-safe: a topic another process created meanwhile is not an error. Any other refusal (a
    replication factor the cluster cannot give, a bad retention, no authorization) is raised, as the broker's error
    for the first topic it refused (the admin client reports them in its answer, not as exceptions).
    """
    async with _admin(bootstrap) as admin:
        existing = set(await admin.list_topics())
        new = [NewTopic(name, n, replication_factor, topic_configs=dict(configs or {}))
               for name, n in partitions.items() if name not in existing]  # fmt: skip
        if new:
            response = await admin.create_topics(new)
            for name, code, message in response.topic_errors:
                if code and code != TopicAlreadyExistsError.errno:
                    raise for_code(code)(f"creating topic {name}: {message}")
        return [t.name for t in new]


async def missing_topics(config: KafkaConfig, names: Iterable[str]) -> list[str]:
    """Those of ``names`` the cluster does not have."""
    async with _admin(config) as admin:
        existing = set(await admin.list_topics())
    return sorted(set(names) - existing)


async def ensure_topics(config: KafkaConfig) -> None:
    """The daemon's own topics (internal, outputs, dead letters): created when missing, with ``[kafka]``'s
    partitions, replication factor and retention; with ``create_topics = false``, :class:`MissingTopics` naming
    those that do not exist."""
    wanted = config.own_topics()
    if not config.create_topics:
        missing = await missing_topics(config, wanted)
        if missing:
            raise MissingTopics(f"kafka.create_topics is false and these topics do not exist: {', '.join(missing)} "
                                "(create them, or let the daemon create them: kafka.create_topics = true)")  # fmt: skip
        return
    configs = {"retention.ms": str(config.retention_ms)} if config.retention_ms is not None else {}
    await create_topics(config, wanted, replication_factor=config.replication_factor, configs=configs)


@contextlib.asynccontextmanager
async def _admin(target: str | KafkaConfig) -> AsyncIterator[AIOKafkaAdminClient]:
    kwargs: dict[str, Any] = (
        {"bootstrap_servers": target} if isinstance(target, str) else client_kwargs(target, "admin")
    )
    admin = AIOKafkaAdminClient(**kwargs)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()
