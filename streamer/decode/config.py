"""``[decode]``: which span attributes carry application facts, and how much of an attribute is kept."""

from __future__ import annotations

from pydantic import Field

from processors.component import Section


class DecodeConfig(Section):
    """Which span attributes carry application facts, and how much of an attribute we keep."""

    tx_id_attribute: str = Field("db.transaction.id", description="span attribute holding the DB transaction id")
    row_version_attribute: str = Field("db.row.version", description="span attribute holding the row version read")
    idempotency_key_attribute: str = "app.idempotency_key"
    max_attribute_bytes: int = Field(
        65_536, ge=64, description="a span attribute or a row value (as JSON) longer than this is oversize"
    )
    oversize: str = Field(
        "truncate",
        pattern="^(dlq|truncate)$",
        description="an oversize span attribute: truncate (cut, counted as truncated_attributes; the message's other "
        "traces and the span are kept) or dlq (the whole message, every trace in it, to the DLQ); an oversize row "
        "value is always replaced by Debezium's unavailable-value placeholder and counted (oversize_values)",
    )
    max_shared_strings: int = Field(
        16_384, ge=1, description="distinct strings (statements, tables, code locations) stage 2's accesses share"
    )
