"""A repaired file as its bytes before and after: the unified diff of a plan, and applying or reverting it.

Applying and reverting are all-or-nothing and idempotent: every file is checked first (it must hold its planned
bytes, or already the target bytes), then written; a file that changed since the plan was made is refused with
:class:`PatchError` and nothing is written. A file the repair creates (a migration) has no bytes before
(``before`` is None): applying creates it (refused when a file is there meanwhile, or its directory is not),
reverting deletes it, and the diff shows it as git does (``--- /dev/null``).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class PatchError(RuntimeError):
    """A patch that cannot be built, applied or reverted safely."""


@dataclass(frozen=True, slots=True)
class FilePatch:
    """One file's bytes before and after the repair (path relative to the root, POSIX separators); ``before`` is
    None for a file the repair creates."""

    path: str
    before: bytes | None
    after: bytes


def unified_diff(files: Sequence[FilePatch]) -> str:
    """A ``git apply``-able unified diff of the files (``a/`` and ``b/`` prefixes, paths relative to the root)."""
    out: list[str] = []
    for f in sorted(files, key=lambda f: f.path):
        before = (f.before or b"").decode().splitlines(keepends=True)
        after = f.after.decode().splitlines(keepends=True)
        source = "/dev/null" if f.before is None else f"a/{f.path}"
        for line in difflib.unified_diff(before, after, source, f"b/{f.path}"):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _swap(files: Sequence[FilePatch], root: Path, *, forward: bool) -> None:
    todo: list[tuple[Path, bytes | None]] = []  # None: delete the file
    for f in files:
        path = root / f.path
        current = path.read_bytes() if f.before is not None or path.exists() else None
        source, target = (f.before, f.after) if forward else (f.after, f.before)
        if current == target:
            continue
        if current != source:
            what = "exists already" if current is not None and source is None else "changed since the plan was made"
            raise PatchError(f"{f.path} {what}; not touching it")
        if target is not None and not path.parent.is_dir():
            raise PatchError(f"{f.path}: its directory is gone; not creating it")
        todo.append((path, target))
    for path, data in todo:
        if data is None:
            path.unlink()
        else:
            path.write_bytes(data)


def apply_files(files: Sequence[FilePatch], root: Path) -> None:
    """Write the repaired files (all checked first: each must hold its planned or its repaired bytes)."""
    _swap(files, root, forward=True)


def revert_files(files: Sequence[FilePatch], root: Path) -> None:
    """Restore the original bytes of the repaired files."""
    _swap(files, root, forward=False)
