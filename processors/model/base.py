"""The base of every published event: frozen, strict, versioned, with its ``kind`` and idempotency key."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA_VERSION: Literal[1] = 1


class Frozen(BaseModel):
    """A frozen pydantic model that rejects unknown fields (parts of events)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Published(Frozen):
    """An event trace-repro publishes on a Kafka topic, keyed by its ``fingerprint`` field.

    ``kind`` names the class on the wire; ``identity`` lists the fields whose values identify one event, so that
    a consumer that sees it twice (a replay) can tell; ``topic`` is the output topic role it is published on
    (``incidents``, ``repros``, ``verdicts``, ``contracts``).
    """

    identity: ClassVar[tuple[str, ...]] = ()
    topic: ClassVar[str] = "incidents"

    @property
    def event_id(self) -> str:
        """The idempotency key: ``kind`` and the identity fields' values."""
        return "\x1f".join([str(getattr(self, "kind", "")), *(str(getattr(self, f)) for f in self.identity)])
