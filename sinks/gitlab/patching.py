"""A strict unified-diff applier, for committing a repro's repair to a merge-request branch.

Only what ``difflib.unified_diff`` and ``git diff`` produce: ``--- a/x`` / ``+++ b/x`` headers, ``@@`` hunks whose
context and removed lines must match exactly (no fuzz, no offset search), ``/dev/null`` for created and deleted
files, and ``\\ No newline at end of file``. Anything else raises :class:`PatchError`; the caller then attaches the
patch instead of applying it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(ValueError):
    """The patch is malformed or does not apply to the given content."""


@dataclass(slots=True)
class FilePatch:
    """The hunks of one file; ``old_path``/``new_path`` are None for a created/deleted file."""

    old_path: str | None
    new_path: str | None
    # (old start line, [(kind " "/"-"/"+", text, ends with a newline)])
    hunks: list[tuple[int, list[tuple[str, str, bool]]]] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def _path(header: str) -> str | None:
    name = header[4:].split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name[2:] if name[:2] in ("a/", "b/") else name


def parse(patch: str) -> list[FilePatch]:
    """The files of a unified diff, in order."""
    files: list[FilePatch] = []
    lines = patch.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            files.append(FilePatch(_path(line), _path(lines[i + 1])))
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            if not files:
                raise PatchError("hunk before any file header")
            old_len = int(m.group(2) or "1")
            new_len = int(m.group(4) or "1")
            body: list[tuple[str, str, bool]] = []
            i += 1
            seen_old = seen_new = 0
            while i < len(lines) and (seen_old < old_len or seen_new < new_len or lines[i].startswith("\\")):
                text = lines[i]
                if text.startswith("\\"):
                    if body:
                        body[-1] = (body[-1][0], body[-1][1], False)  # no newline at end of file
                    i += 1
                    continue
                kind = text[:1] or " "
                if kind not in " +-":
                    raise PatchError(f"bad hunk line {i + 1}")
                seen_old += kind in " -"
                seen_new += kind in " +"
                body.append((kind, text[1:], True))
                i += 1
            if seen_old != old_len or seen_new != new_len:
                raise PatchError("truncated hunk")
            files[-1].hunks.append((int(m.group(1)), body))
            continue
        i += 1
    if not files:
        raise PatchError("no file in patch")
    return files


def apply(original: str | None, fp: FilePatch) -> str | None:
    """The new content of one file (None when the patch deletes it); raises :class:`PatchError`."""
    if fp.old_path is None:
        if original is not None:
            raise PatchError(f"{fp.path} already exists")
        src: list[str] = []
    else:
        if original is None:
            raise PatchError(f"{fp.path} does not exist")
        src = original.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for start, body in fp.hunks:
        at = max(start - 1, 0) if any(kind in " -" for kind, _, _ in body) else start
        if at < pos or at > len(src):
            raise PatchError(f"{fp.path}: hunk at line {start} out of order")
        out += src[pos:at]
        pos = at
        for kind, text, newline in body:
            eol = "\n" if newline else ""
            if kind in " -":
                if pos >= len(src) or src[pos] != text + eol:
                    raise PatchError(f"{fp.path}: context does not match at line {pos + 1}")
                pos += 1
            if kind in " +":
                out.append(text + eol)
    out += src[pos:]
    if fp.new_path is None:
        return None
    return "".join(out)
