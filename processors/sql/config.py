"""``[sql]``: how statements map to rows."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class SqlConfig(Section):
    """How statements map to rows: key columns per table, version columns, identity of inserts."""

    key_columns: dict[str, list[str]] = Field(
        default_factory=dict,
        description="table -> key columns; overrides what Debezium's message keys say (learned, kept on the graph)",
    )
    version_columns: list[str] = Field(
        default_factory=lambda: ["version"], description="columns that, compared with =, make an update a version check"
    )
    insert_identity: dict[str, list[str]] = Field(
        default_factory=dict, description="table -> columns identifying an insert whose key the DB assigns"
    )
    statement_cache: int = Field(4096, ge=1, description="parsed statement shapes kept (LRU)")
    max_tables: int = Field(10_000, ge=1, description="tables whose keys and unkeyed statements are tracked (LRU)")
