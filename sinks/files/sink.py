"""Output events to JSON-lines files, for users with no Kafka consumer of their own downstream.

One file per kind in one directory: ``incidents.jsonl``, ``repros.jsonl``, ``verdicts.jsonl``, ``regressions.jsonl``
(``<kind>s.jsonl``, :mod:`sinks.files.ids`), one event per line exactly as published on Kafka. ``write`` buffers,
``flush`` appends and fsyncs, so a flushed event survives a crash; files rotate by size (:mod:`sinks.files.disk`).

Idempotent against replays: the sink remembers the ids of the last ``remember`` events of each kind it wrote (a
:class:`~processors.state.lru.CountedLRU` per kind, each id it forgets counted as a drop ``remember``), loaded on
start from the tail (``tail_bytes``) of the existing files, newest first, so an event replayed by the runtime after
a crash or a rebalance is not written twice; each one skipped is counted as ``duplicates``. A line torn by a crash
in the middle of a write (never fsynced, so never acknowledged) is cut off on start; its event is replayed.

A failed flush drops nothing: the events it did not write stay buffered, in order, for the next flush, and it is
counted as ``flush_failures``; a disk error is raised as ``RetryableSinkError``, anything else as it is. Blocking
file I/O runs in a worker thread; the buffer and the id memories belong to the event loop's thread.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import structlog

from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.state.lru import CountedLRU
from sinks.base import RetryableSinkError, Sink
from sinks.files.disk import JsonlFiles, Line, Outcome, cut_torn_line, tail_lines
from sinks.files.ids import event_id, file_name, identity, kind_of

log = structlog.get_logger("trace_repro.sinks.files")

TELEMETRY = "file_sink"
REMEMBER = "remember"  # the drop reason of an id forgotten at the ``remember`` bound


class FileSink(Sink):
    """Append output events to ``<directory>/<kind>s.jsonl`` with fsync, size rotation and replay deduplication."""

    name = "files"

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        keep: int = 5,
        remember: int = 100_000,
        tail_bytes: int = 16 * 1024 * 1024,
        telemetry: Telemetry | None = None,
    ) -> None:
        if max_bytes < 1 or keep < 0 or remember < 1 or tail_bytes < 0:
            raise ValueError("max_bytes and remember must be >= 1, keep and tail_bytes >= 0")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.keep = keep
        self.remember = remember
        self.tail_bytes = tail_bytes
        self.telemetry = (telemetry or Telemetry(TELEMETRY)).declare(REMEMBER)
        self.written = 0  # lines appended
        self.rotations: dict[str, int] = {}  # rotations per kind
        self.repaired = 0  # torn last lines cut off on start
        self._buffer: list[Line] = []
        self._pending: set[tuple[str, str]] = set()  # (kind, id) buffered or being written
        self._seen: dict[str, CountedLRU[str, None]] = {}
        self._files = JsonlFiles(self.directory, max_bytes=max_bytes, keep=keep)  # the flushing thread's
        self._flushing = asyncio.Lock()
        self._error: str | None = None
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._load()

    # ---- the sink interface -------------------------------------------------------------------------------------

    async def write(self, event: Published) -> None:
        """Buffer one event unless an event with the same id was already written or buffered."""
        if self._closed:
            raise RuntimeError("FileSink is closed")
        kind = getattr(event, "kind", None)
        if not isinstance(kind, str):
            raise TypeError(f"{type(event).__name__} has no 'kind' field")
        file_name(kind)
        line = event.model_dump_json()
        fields = identity(kind)
        doc = {f: getattr(event, f) for f in fields} if fields is not None else json.loads(line)
        key = event_id(kind, doc)
        if key in self._seen_for(kind) or (kind, key) in self._pending:
            self.telemetry.count("duplicates")
            return
        self._pending.add((kind, key))
        self._buffer.append(Line(kind, key, line.encode() + b"\n"))

    async def flush(self) -> None:
        """Append the buffered events to their files and fsync them; a disk error raises ``RetryableSinkError``.

        Events written before a failure count as written; the others stay buffered for the next flush.
        """
        async with self._flushing:
            if not self._buffer:
                return
            batch, self._buffer = self._buffer, []
            writing = asyncio.ensure_future(asyncio.to_thread(self._files.write, batch))
            try:
                outcome = await asyncio.shield(writing)
            except asyncio.CancelledError:  # a thread cannot be stopped: record what it wrote, then give up
                self._settle(batch, await writing)
                raise
            self._settle(batch, outcome)
            if isinstance(outcome.error, OSError):
                raise RetryableSinkError(f"file sink {self.directory}: {self._error}") from outcome.error
            if outcome.error is not None:
                raise outcome.error

    def _settle(self, batch: list[Line], outcome: Outcome) -> None:
        """Remember what the writing thread wrote; buffer again, in order, what it did not."""
        for p in outcome.written:
            self._seen_for(p.kind).add(p.key)
            self._pending.discard((p.kind, p.key))
        for kind, n in outcome.rotations.items():
            self.rotations[kind] = self.rotations.get(kind, 0) + n
        self.written += len(outcome.written)
        if outcome.error is None:
            self._error = None
            return
        done = {id(p) for p in outcome.written}
        self._buffer[:0] = [p for p in batch if id(p) not in done]
        self._error = f"{type(outcome.error).__name__}: {outcome.error}"
        self.telemetry.count("flush_failures")
        log.warning("files.flush_failed", directory=str(self.directory), error=self._error,
                    buffered=len(self._buffer))  # fmt: skip

    async def healthcheck(self) -> bool:
        """True while the directory is writable and the last flush succeeded."""
        return (
            not self._closed
            and self._error is None
            and self.directory.is_dir()
            and os.access(self.directory, os.W_OK | os.X_OK)
        )

    async def close(self) -> None:
        """Flush what is buffered and close the files; calling it again does nothing."""
        if self._closed:
            return
        try:
            await self.flush()
        finally:
            self._closed = True
            async with self._flushing:
                self._files.close()

    # ---- state ------------------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Events written and not yet flushed."""
        return len(self._buffer)

    @property
    def last_error(self) -> str | None:
        """The error of the last flush, or None if it succeeded."""
        return self._error

    def remembered(self, kind: str) -> int:
        """How many ids of ``kind`` the sink remembers as written."""
        return len(self._seen_for(kind))

    def _seen_for(self, kind: str) -> CountedLRU[str, None]:
        seen = self._seen.get(kind)
        if seen is None:
            seen = self._seen[kind] = CountedLRU(self.remember, self.telemetry, REMEMBER)
        return seen

    # ---- start: repair and load ids ---------------------------------------------------------------------------

    def _load(self) -> None:
        for path in sorted(self.directory.glob("*s.jsonl")):
            kind = kind_of(path.name)
            if kind is None:
                continue
            if cut_torn_line(path):
                self.repaired += 1
            seen = self._seen_for(kind)
            lines = list(tail_lines(path, self.keep, self.tail_bytes))  # newest first
            for line in reversed(lines[: self.remember]):
                try:
                    doc = json.loads(line)
                    seen.add(event_id(kind, doc))
                except (ValueError, TypeError, KeyError):  # not JSON, not an object, no id field
                    log.warning("files.bad_line", file=path.name, line=line[:80])
            log.info("files.loaded", file=path.name, remembered=len(seen))
