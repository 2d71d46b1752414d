"""The file sink's files on disk: appending with fsync and size rotation, and reading them back on start.

:class:`JsonlFiles` is used by the flushing thread only. ``write`` appends a batch per kind, in order: each chunk
of lines is written, flushed and fsynced (the directory too after a file was created or renamed), so a line is
durable once ``write`` reports it. A file that would grow past ``max_bytes`` is rotated first (``incidents.jsonl``
-> ``incidents.jsonl.1`` -> ... -> ``.<keep>``, the oldest dropped; with ``keep=0`` the full file is deleted). A
chunk that fails half-written is cut back off, so that the file always ends on a line boundary; what was written
before the error stays written and is reported with it.

On start, :func:`cut_torn_line` removes a last line without its newline (a write torn by a crash, never fsynced as
complete, so never acknowledged) and :func:`tail_lines` reads complete lines newest first, from the current file
into its rotations, within a byte budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import structlog

from sinks.files.ids import file_name

log = structlog.get_logger("trace_repro.sinks.files")


@dataclass(frozen=True)
class Line:
    """One event's line, with its kind and its id."""

    kind: str
    key: str
    data: bytes  # the JSON and its newline


@dataclass
class Outcome:
    """What one ``write`` did: the lines now durable, rotations per kind, and the error that stopped it."""

    written: list[Line] = field(default_factory=list)
    rotations: dict[str, int] = field(default_factory=dict)
    error: Exception | None = None


def rotated(path: Path, index: int) -> Path:
    """The ``index``-th rotation of ``path`` (``incidents.jsonl.1`` is the newest)."""
    return path.with_name(f"{path.name}.{index}")


class JsonlFiles:
    """The open ``<kind>s.jsonl`` files of one directory, appended to by one thread at a time."""

    def __init__(self, directory: Path, *, max_bytes: int, keep: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.keep = keep
        self._files: dict[str, BinaryIO] = {}
        self._sizes: dict[str, int] = {}
        self._directory_dirty = False  # a file was created or renamed since the directory was last fsynced

    def write(self, batch: list[Line]) -> Outcome:
        """Append ``batch``; an error is reported in the outcome, with the lines written before it."""
        out = Outcome()
        try:
            for kind in dict.fromkeys(p.kind for p in batch):
                self.write_kind(kind, [p for p in batch if p.kind == kind], out)
        except Exception as exc:  # reported by the sink's flush; what was written before it stays written
            out.error = exc
        return out

    def write_kind(self, kind: str, items: list[Line], out: Outcome) -> None:
        """Append the lines of one kind, rotating before a chunk would pass ``max_bytes``."""
        path = self.directory / file_name(kind)
        chunk: list[Line] = []
        chunk_bytes = 0
        for p in items:
            size = self._size(kind, path)
            if size + chunk_bytes + len(p.data) > self.max_bytes and size + chunk_bytes > 0:
                self._append(kind, path, chunk, out)
                chunk, chunk_bytes = [], 0
                self._rotate(kind, path)
                out.rotations[kind] = out.rotations.get(kind, 0) + 1
            chunk.append(p)
            chunk_bytes += len(p.data)
        self._append(kind, path, chunk, out)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

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

    def _append(self, kind: str, path: Path, chunk: list[Line], out: Outcome) -> None:
        if not chunk:
            return
        f = self._open(kind, path)
        before = self._sizes[kind]
        try:
            f.write(b"".join(p.data for p in chunk))
            f.flush()
            os.fsync(f.fileno())
            if self._directory_dirty:
                self._fsync_directory()
                self._directory_dirty = False
        except OSError:
            self._truncate(kind, before)
            raise
        self._sizes[kind] = before + sum(len(p.data) for p in chunk)
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
                older = rotated(path, i)
                if older.exists():
                    older.replace(rotated(path, i + 1))
            path.replace(rotated(path, 1))
        self._directory_dirty = True  # fsynced with the first lines of the new file
        log.info("files.rotated", file=path.name, keep=self.keep)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---- start: repair and read back -------------------------------------------------------------------------------


def cut_torn_line(path: Path) -> int:
    """Cut off a last line without its newline (a write torn by a crash); returns the bytes removed."""
    with path.open("r+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
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
    log.warning("files.torn_line_removed", file=path.name, removed_bytes=size - keep_bytes)
    return size - keep_bytes


def tail_lines(path: Path, keep: int, budget: int) -> Iterator[bytes]:
    """Complete lines of ``path`` then of its ``keep`` rotations, newest first, within ``budget`` bytes in all."""
    for candidate in [path, *(rotated(path, i) for i in range(1, keep + 1))]:
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
