"""The ``[file_sink]`` config section: whether the file sink runs, where it writes, and its bounds."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class FileSinkConfig(Section):
    """Output events appended to JSON-lines files, for users without a Kafka consumer downstream."""

    enabled: bool = Field(False, description="write the output events to files (off unless set)")
    directory: str = Field("out/events", description="directory of the <kind>s.jsonl files, created if missing")
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024, description="rotate a file before it grows past this")
    keep: int = Field(5, ge=0, description="rotated files kept per kind")
    remember: int = Field(100_000, ge=1, description="event ids remembered per kind against replays")
    tail_bytes: int = Field(16 * 1024 * 1024, ge=0, description="bytes of existing files read on start to load ids")
