"""The ``[redaction]`` config section: what of production's values may leave the daemon, column by column.

Row images (Debezium ``before``/``after``) and statement parameters are production data. Before an event leaves
the daemon (Kafka topics, and so GitLab issues, repro files and every other sink) each value is kept, dropped (the
marker ``[REDACTED]`` takes its place) or replaced by a keyed hash (``[HMAC:<16 hex>]``, HMAC-SHA256 with the
secret ``redaction_key``, ``TRACE_REPRO_REDACTION_KEY``: equal values still compare equal within and across
incidents, the value cannot be read back without the key).

A column's action: its rule in ``columns`` (``"table.column"`` first, then ``"column"`` in any table), else
``sensitive_action`` when its name looks sensitive (one of the ``sensitive`` words is among the words of its
name: ``card_number``, ``userEmail``, ``date_of_birth``), else ``keep``. ``hash`` needs the key: a ``hash`` rule
without it fails at start (the daemon never invents a key that would change at every restart); ``auto`` is
``hash`` with a key and ``drop`` without.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from processors.api.component import Section

Action = Literal["drop", "hash", "keep"]

SENSITIVE = (
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "apikey",
    "ssn",
    "card",
    "pan",
    "cvv",
    "iban",
    "email",
    "phone",
    "address",
    "dob",
    "birth",
)


class RedactionConfig(Section):
    """Which values of rows and statement parameters leave the daemon, and how (key: ``redaction_key``)."""

    enabled: bool = Field(True, description="false: every value leaves as it is (not for production data)")
    sensitive: list[str] = Field(
        default_factory=lambda: list(SENSITIVE),
        description="words (snake_case: api_key) that make a column sensitive when among the words of its name",
    )
    sensitive_action: Literal["auto", "drop", "hash", "keep"] = Field(
        "auto", description="action on sensitive columns: auto = hash with a redaction_key, else drop"
    )
    columns: dict[str, Action] = Field(
        default_factory=dict, description='per column: {"users.email" = "hash", "notes" = "drop"}; wins over names'
    )
    unknown_parameters: Action = Field(
        "keep",
        description="statement parameters bound to no known column (expressions, functions): the repro needs them; a "
        "parameter equal to a value redacted elsewhere in the event is redacted with it all the same",
    )
    keys: Literal["keep", "hash"] = Field("keep", description="entity keys (orders:8812): identifiers, kept")

    def hashes(self) -> bool:
        """Whether a rule asks for a hash whatever the key (``auto`` asks only when there is one)."""
        return (
            self.sensitive_action == "hash"
            or self.unknown_parameters == "hash"
            or self.keys == "hash"
            or ("hash" in self.columns.values())
        )


__all__ = ["SENSITIVE", "Action", "RedactionConfig"]
