"""Output events to JSON-lines files, for users with no Kafka consumer of their own downstream.

One file per kind in one directory: ``incidents.jsonl``, ``repros.jsonl``, ``verdicts.jsonl``, ``regressions.jsonl``
(``<kind>s.jsonl``), one event per line exactly as published on Kafka. ``add`` buffers, ``flush`` appends and
fsyncs, so a flushed event survives a crash; a file that would grow past ``max_bytes`` is rotated first
(``incidents.jsonl`` -> ``incidents.jsonl.1`` -> ... -> ``.<keep>``, the oldest dropped).

Idempotent against replays: the sink remembers the ids of the last ``remember`` events of each kind it wrote,
loaded on start from the tail (``tail_bytes``) of the existing files, newest first, so an event replayed by the
sink runner after a crash or a rebalance is not written twice. The ids: ``IncidentEvent.occurrence``;
``ReproEvent`` fingerprint + test_path; ``VerdictEvent`` fingerprint + version + outcome; ``RegressionEvent``
occurrence; any other kind, a hash of its JSON. A line torn by a crash in the middle of a write (never fsynced,
so never acknowledged) is cut off on start; its event is replayed from Kafka.

Blocking file I/O runs in a worker thread; the buffer and the id sets belong to the event loop's thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import structlog
from pydantic import BaseModel

from sinks.errors import RetryableSinkError

log = structlog.get_logger("trace_repro.sinks.files")

_KIND = re.compile(r"[a-z][a-z0-9_]{0,62}")
_SEP = "\x1f"


IDENTITIES: dict[str, tuple[str, ...]] = {
    "incident": ("occurrence",),
    "repro": ("fingerprint", "test_path"),
    "verdict": ("fingerprint", "version", "outcome"),
    "regression": ("occurrence",),  # processors.regressions.RegressionEvent: fingerprint + window + version
}


def event_id(kind: str, doc: Mapping[str, Any]) -> str:
    """The id of one event of ``kind`` (its JSON object) under which a replay is recognised.

    The fields in ``IDENTITIES`` for the kinds that have them, else a hash of the whole event.
    """
    fields = IDENTITIES.get(kind)
    if fields is not None:
        return _SEP.join(str(doc[f]) for f in fields)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def file_name(kind: str) -> str:
    """The file of one kind of event: ``incident`` -> ``incidents.jsonl``."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"event kind {kind!r} is not a valid file name stem")
    return f"{kind}s.jsonl"


class _Seen:
    """A bounded set of ids: the oldest is forgotten first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, key: str) -> None:
        if key in self._ids:
            return
        self._ids[key] = None
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)


@dataclass(frozen=True)
class _Pending:
    kind: str
    key: str
    line: bytes


@dataclass
class _Outcome:
    written: list[_Pending] = field(default_factory=list)
    rotations: dict[str, int] = field(default_factory=dict)
    error: Exception | None = None


class FileSink:
    """Append output events to ``<directory>/<kind>s.jsonl`` with fsync, size rotation and replay deduplication."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        keep: int = 5,
        remember: int = 100_000,
        tail_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if max_bytes < 1 or keep < 0 or remember < 1 or tail_bytes < 0:
            raise ValueError("max_bytes and remember must be >= 1, keep and tail_bytes >= 0")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.keep = keep
        self.remember = remember
        self.tail_bytes = tail_bytes
        self.written = 0  # lines appended
        self.duplicates = 0  # events not written again (replays)
        self.rotations: dict[str, int] = {}  # rotations per kind
        self.repaired = 0  # torn last lines cut off on start
        self._buffer: list[_Pending] = []
        self._pending: set[tuple[str, str]] = set()  # (kind, id) buffered or being written
        self._seen: dict[str, _Seen] = {}
        self._files: dict[str, BinaryIO] = {}  # touched by the flushing thread only
        self._sizes: dict[str, int] = {}
        self._directory_dirty = False  # a file was created or renamed since the directory was last fsynced
        self._flushing = asyncio.Lock()
        self._error: str | None = None
        self._closed = False
        self.directory.mkdir(parents=True, exist_ok=True)
        self._load()

    # ---- the sink interface (see streamer.runtime.sink_runner.Sink) -------------------------------------------------

    async def add(self, event: BaseModel) -> None:
        """Buffer one event unless an event with the same id was already written or buffered."""
        if self._closed:
            raise RuntimeError("FileSink is closed")
        kind = getattr(event, "kind", None)
        if not isinstance(kind, str):
            raise TypeError(f"{type(event).__name__} has no 'kind' field")
        file_name(kind)
        line = event.model_dump_json()
        fields = IDENTITIES.get(kind)
        doc = {f: getattr(event, f) for f in fields} if fields is not None else json.loads(line)
        key = event_id(kind, doc)
        if key in self._seen_for(kind) or (kind, key) in self._pending:
            self.duplicates += 1
            return
        self._pending.add((kind, key))
        self._buffer.append(_Pending(kind, key, line.encode() + b"\n"))

    async def flush(self) -> None:
        """Append the buffered events to their files and fsync them; a disk error raises ``RetryableSinkError``.

        Events written before a failure count as written; the others stay buffered for the next flush.
        """
        async with self._flushing:
            if not self._buffer:
                return
            batch, self._buffer = self._buffer, []
            writing = asyncio.ensure_future(asyncio.to_thread(self._write, batch))
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

    def _settle(self, batch: list[_Pending], outcome: _Outcome) -> None:
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
                for f in self._files.values():
                    f.close()
                self._files.clear()

    # ---- state ------------------------------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Events added and not yet flushed."""
        return len(self._buffer)

    @property
    def last_error(self) -> str | None:
        """The error of the last flush, or None if it succeeded."""
        return self._error

    def remembered(self, kind: str) -> int:
        """How many ids of ``kind`` the sink remembers as written."""
        return len(self._seen_for(kind))

    def _seen_for(self, kind: str) -> _Seen:
        seen = self._seen.get(kind)
        if seen is None:
            seen = self._seen[kind] = _Seen(self.remember)
        return seen

    # ---- start: repair and load ids ---------------------------------------------------------------------------

    def _load(self) -> None:
        for path in sorted(self.directory.glob("*s.jsonl")):
            kind = path.name.removesuffix("s.jsonl")
            if not _KIND.fullmatch(kind):
                continue
            self._repair(path)
            seen = self._seen_for(kind)
            lines = list(self._tail_lines(path))  # newest first
            for line in reversed(lines[: self.remember]):
                try:
                    doc = json.loads(line)
                    seen.add(event_id(kind, doc))
                except (ValueError, TypeError, KeyError):  # not JSON, not an object, no id field
                    log.warning("files.bad_line", file=path.name, line=line[:80])
            log.info("files.loaded", file=path.name, remembered=len(seen))

    def _repair(self, path: Path) -> None:
        """Cut off a last line without its newline: a write torn by a crash, never fsynced as complete."""
        with path.open("r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            end = size
            step = 64 * 1024
            while end > 0:
                start = max(0, end - step)
                f.seek(start)
                chunk = f.read(end - start)
                cut = chunk.rfind(b"\n")
                if cut >= 0:
                    keep_bytes = start + cut + 1
                    break
                end = start
            else:
                keep_bytes = 0
            f.truncate(keep_bytes)
            f.flush()
            os.fsync(f.fileno())
        self.repaired += 1
        log.warning("files.torn_line_removed", file=path.name, removed_bytes=size - keep_bytes)

    def _tail_lines(self, path: Path) -> Iterator[bytes]:
        """Complete lines of the current file then its rotations, newest first, within ``tail_bytes`` in all."""
        budget = self.tail_bytes
        for candidate in [path, *(self._rotated(path, i) for i in range(1, self.keep + 1))]:
            if budget <= 0:
                return
            try:
                with candidate.open("rb") as f:
                    size = f.seek(0, os.SEEK_END)
                    take = min(size, budget)
                    f.seek(size - take)
                    data = f.read(take)
            except FileNotFoundError:
                continue
            budget -= take
            lines = data.split(b"\n")
            if take < size:
                lines = lines[1:]  # the first one is cut
            for line in reversed(lines):
                if line.strip():
                    yield line

    # ---- the flushing thread ----------------------------------------------------------------------------------

    @staticmethod
    def _rotated(path: Path, index: int) -> Path:
        return path.with_name(f"{path.name}.{index}")

    def _write(self, batch: list[_Pending]) -> _Outcome:
        out = _Outcome()
        try:
            for kind in dict.fromkeys(p.kind for p in batch):
                self._write_kind(kind, [p for p in batch if p.kind == kind], out)
        except Exception as exc:  # reported by flush(); what was written before it stays written
            out.error = exc
        return out

    def _write_kind(self, kind: str, items: list[_Pending], out: _Outcome) -> None:
        path = self.directory / file_name(kind)
        chunk: list[_Pending] = []
        chunk_bytes = 0
        for p in items:
            size = self._size(kind, path)
            if size + chunk_bytes + len(p.line) > self.max_bytes and size + chunk_bytes > 0:
                self._append(kind, path, chunk, out)
                chunk, chunk_bytes = [], 0
                self._rotate(kind, path)
                out.rotations[kind] = out.rotations.get(kind, 0) + 1
            chunk.append(p)
            chunk_bytes += len(p.line)
        self._append(kind, path, chunk, out)

    def _size(self, kind: str, path: Path) -> int:
        if kind not in self._sizes:
            self._open(kind, path)
        return self._sizes[kind]

    def _open(self, kind: str, path: Path) -> BinaryIO:
        f = self._files.get(kind)
        if f is None:
            self._directory_dirty |= not path.exists()
            f = self._files[kind] = path.open("ab")
            self._sizes[kind] = os.fstat(f.fileno()).st_size
        return f

    def _append(self, kind: str, path: Path, chunk: list[_Pending], out: _Outcome) -> None:
        if not chunk:
            return
        f = self._open(kind, path)
        before = self._sizes[kind]
        try:
            f.write(b"".join(p.line for p in chunk))
            f.flush()
            os.fsync(f.fileno())
            if self._directory_dirty:
                self._fsync_directory()
                self._directory_dirty = False
        except OSError:
            self._truncate(kind, before)
            raise
        self._sizes[kind] = before + sum(len(p.line) for p in chunk)
        out.written.extend(chunk)

    def _truncate(self, kind: str, size: int) -> None:
        """Take a half-written chunk back out, so that the next append starts on a line boundary."""
        f = self._files.pop(kind)
        self._sizes.pop(kind, None)
        try:
            os.ftruncate(f.fileno(), size)
            os.fsync(f.fileno())
        except OSError as exc:  # the torn tail is cut off on the next start instead
            log.error("files.truncate_failed", kind=kind, error=str(exc))
        finally:
            try:
                f.close()
            except OSError as exc:  # the buffered bytes that failed to write fail again here
                log.debug("files.close_failed", kind=kind, error=str(exc))

    def _rotate(self, kind: str, path: Path) -> None:
        f = self._files.pop(kind, None)
        if f is not None:
            f.close()
        self._sizes.pop(kind, None)
        for extra in path.parent.glob(f"{path.name}.*"):  # older than `keep` (keep lowered since)
            suffix = extra.name.rsplit(".", 1)[1]
            if suffix.isdigit() and int(suffix) > self.keep:
                extra.unlink()
        if self.keep == 0:
            path.unlink()
        else:
            for i in range(self.keep - 1, 0, -1):
                older = self._rotated(path, i)
                if older.exists():
                    older.replace(self._rotated(path, i + 1))
            path.replace(self._rotated(path, 1))
        self._directory_dirty = True  # fsynced with the first lines of the new file
        log.info("files.rotated", file=path.name, keep=self.keep)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
