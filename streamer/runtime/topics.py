"""Creating Kafka topics that do not exist yet (the daemon's own topics; bench and test topics)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError


async def create_topics(bootstrap: str, partitions: Mapping[str, int]) -> list[str]:
    """Create every topic of ``{name: partitions}`` that is missing (replication 1); returns those created.

    Idempotent and race-safe: a topic another process created meanwhile is not an error.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [NewTopic(name, n, 1) for name, n in partitions.items() if name not in existing]
        if new:
            with contextlib.suppress(TopicAlreadyExistsError):
                await admin.create_topics(new)
        return [t.name for t in new]
    finally:
        await admin.close()
