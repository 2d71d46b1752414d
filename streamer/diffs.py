"""Unified diffs (``git diff``, ``diff -u``) as the added and removed lines, each with its file and line number."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, slots=True)
class DiffLine:
    path: str
    number: int  # line number in the new file (added) or the old file (removed)
    text: str


@dataclass(slots=True)
class Diff:
    added: list[DiffLine] = field(default_factory=list)
    removed: list[DiffLine] = field(default_factory=list)


def _path(header: str) -> str:
    name = header[4:].split("\t", 1)[0].strip()
    if name == "/dev/null":
        return ""
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_diff(text: str) -> Diff:
    """Added and removed lines of a unified diff (``git diff`` or ``diff -u``), with file and line number."""
    diff = Diff()
    old_path = new_path = ""
    old_left = new_left = 0
    old_no = new_no = 0
    for line in text.splitlines():
        if line.startswith("diff --git "):
            old_left = new_left = 0  # a new file ends any hunk, even one whose counts were wrong
            old_path = new_path = ""
            continue
        if old_left > 0 or new_left > 0:
            tag, body = line[:1], line[1:]
            if tag == "+":
                diff.added.append(DiffLine(new_path or old_path, new_no, body))
                new_no += 1
                new_left -= 1
            elif tag == "-":
                diff.removed.append(DiffLine(old_path or new_path, old_no, body))
                old_no += 1
                old_left -= 1
            elif tag == "\\":
                continue  # "\ No newline at end of file"
            else:
                old_no, new_no, old_left, new_left = old_no + 1, new_no + 1, old_left - 1, new_left - 1
            continue
        if line.startswith("--- "):
            old_path = _path(line)
        elif line.startswith("+++ "):
            new_path = _path(line)
        elif m := HUNK.match(line):
            old_no, new_no = int(m[1]), int(m[3])
            old_left = int(m[2]) if m[2] is not None else 1
            new_left = int(m[4]) if m[4] is not None else 1
    return diff
