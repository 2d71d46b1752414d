"""The redaction policy: a column's action, and a value as it may leave the daemon (kept, dropped or hashed).

Decided once per column name (cached, bounded) and applied per value. Markers are recognisable, so a value
redacted once is never redacted again (an event that passes twice is unchanged the second time) and a repro, a
reader or a test can tell a placeholder from data: :data:`DROPPED` for a dropped value, ``[HMAC:<16 hex>]`` for a
hashed one (HMAC-SHA256 of the value's JSON text, first 64 bits: the same value gives the same token under one
key, in every event and every restart). Counts ``redacted_drop`` and ``redacted_hash`` on the component's
telemetry (``trace_repro_component_events_total{component="redaction"}``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from typing import Any

from processors.api.telemetry import Telemetry
from processors.redaction.config import Action, RedactionConfig

DROPPED = "[REDACTED]"
HASHED = "[HMAC:"
HASH_HEX = 16
MAX_COLUMNS = 4096  # column actions cached (a bound: past it the cache starts over, counted as max_columns)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


class RedactionKeyMissing(ValueError):
    """A ``hash`` rule without a ``redaction_key``: refused at start rather than hashed with a made-up key."""


def words(name: str) -> tuple[str, ...]:
    """The words of a column name, lower case: ``cardNumber`` and ``card_number`` are both (card, number)."""
    return tuple(w.lower() for w in _WORDS.findall(name))


def is_marker(value: object) -> bool:
    """Whether ``value`` is a placeholder this policy made (never redacted again)."""
    return isinstance(value, str) and (value == DROPPED or (value.startswith(HASHED) and value.endswith("]")))


def canonical(value: object) -> str:
    """The text a value is hashed and matched by: its JSON (a parameter ``'a@b.c'`` and a row's ``a@b.c`` agree)."""
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


class Policy:
    """A :class:`RedactionConfig` with its key: see the module docstring."""

    __slots__ = ("_actions", "_key", "_sensitive", "config", "telemetry")

    def __init__(self, config: RedactionConfig, key: bytes | None = None, telemetry: Telemetry | None = None) -> None:
        if config.enabled and config.hashes() and not key:
            raise RedactionKeyMissing(
                "redaction: a rule says hash but redaction_key is not set (TRACE_REPRO_REDACTION_KEY); set a key, "
                "or use drop"
            )
        self.config = config
        self._key = key or b""
        self._sensitive = [tuple(w.lower() for w in s.replace("-", "_").split("_") if w) for s in config.sensitive]
        self._actions: dict[tuple[str, str], Action] = {}
        self.telemetry = (telemetry or Telemetry("redaction")).declare("max_columns")
        for action in ("drop", "hash"):
            self.telemetry.events.setdefault(f"redacted_{action}", 0)

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def sensitive(self, column: str) -> bool:
        """Whether a column's name looks sensitive: one of the configured words is among its words, in order."""
        have = words(column)
        return any(
            len(w) <= len(have) and any(have[i : i + len(w)] == w for i in range(len(have) - len(w) + 1))
            for w in self._sensitive
            if w
        )

    def action(self, table: str, column: str) -> Action:
        """What happens to ``column`` of ``table``'s values (rules, then its name, then ``keep``)."""
        found = self._actions.get((table, column))
        if found is not None:
            return found
        rules = self.config.columns
        action: Action | None = rules.get(f"{table}.{column}") or rules.get(column)
        if action is None:
            chosen = self.config.sensitive_action if self.sensitive(column) else "keep"
            action = ("hash" if self._key else "drop") if chosen == "auto" else chosen
        if len(self._actions) >= MAX_COLUMNS:
            self._actions.clear()
            self.telemetry.drop("max_columns")
        self._actions[(table, column)] = action
        return action

    def apply(self, action: Action, value: Any) -> Any:
        """``value`` as it may leave (None and markers stay as they are; a dropped or hashed value is counted)."""
        if action == "keep" or value is None or is_marker(value):
            return value
        self.telemetry.count(f"redacted_{action}")
        if action == "drop":
            return DROPPED
        return self.token(value)

    def token(self, value: Any) -> str:
        digest = hmac.new(self._key, canonical(value).encode(), hashlib.sha256).hexdigest()
        return f"{HASHED}{digest[:HASH_HEX]}]"


__all__ = ["DROPPED", "HASHED", "Policy", "RedactionKeyMissing", "canonical", "is_marker", "words"]
