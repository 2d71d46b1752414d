"""The ``file_sink`` component: a sink of the incidents, repros and verdicts topics, built from ``[file_sink]``.

Regressions are published on the incidents topic, so they reach the sink too. The sink counts into the daemon's
telemetry of ``file_sink`` (duplicates skipped, ids forgotten at the ``remember`` bound, failed flushes).
"""

from __future__ import annotations

from pathlib import Path

from processors.api.component import Context, Factory
from sinks.files.config import FileSinkConfig
from sinks.files.sink import TELEMETRY, FileSink


def create(config: FileSinkConfig, ctx: Context) -> FileSink:
    """The file sink of ``config``, counting into ``ctx``'s telemetry of ``file_sink``."""
    return FileSink(Path(config.directory), max_bytes=config.max_bytes, keep=config.keep, remember=config.remember,
                    tail_bytes=config.tail_bytes, telemetry=ctx.telemetry(TELEMETRY))  # fmt: skip


FACTORY: Factory[FileSinkConfig, FileSink] = Factory(
    kind="sink",
    name="file_sink",
    config=FileSinkConfig,
    create=create,
    topics=("incidents", "repros", "verdicts"),
    enabled=lambda c: c.enabled,
)
