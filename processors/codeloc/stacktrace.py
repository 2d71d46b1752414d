"""Frames of an ``exception.stacktrace``, innermost first, in Python's and Java's formats.

Python (``traceback.format_exception``) writes ``  File "/app/shop/views.py", line 42, in withdraw``, outermost
first; Java (``Throwable.printStackTrace``) writes ``\tat com.shop.Accounts.withdraw(Accounts.java:42)``, innermost
first, and its ``Caused by:`` sections after. Only the first exception's frames are read (Python prints
the cause first and the exception raised last: its own block is the last one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_PY: Final = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)\s*$')
_JAVA: Final = re.compile(r"^\s*at (?:[\w.$/@-]+/)?([\w.$]+)\.([\w$<>]+)\(([^():]+)(?::(\d+))?\)\s*$")
_PY_CHAIN: Final = ("During handling of the above exception", "The above exception was the direct cause")
MAX_FRAMES: Final = 512


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame: for Python the file path and function name; for Java the class and method, the file name."""

    file: str
    line: int
    function: str
    owner: str = ""  # Java: the fully qualified class (``com.shop.AccountController``)


def frames(stacktrace: str) -> list[Frame]:
    """The frames of the stack trace's (last raised) exception, innermost first; [] when it is neither format."""
    lines = stacktrace.splitlines()
    if any(line.startswith(_PY_CHAIN) for line in lines):
        last = max(i for i, line in enumerate(lines) if line.startswith(_PY_CHAIN))
        lines = lines[last + 1 :]
    python = [m for line in lines if (m := _PY.match(line))]
    if python:
        return [Frame(m[1], int(m[2]), m[3]) for m in reversed(python[-MAX_FRAMES:])]
    out: list[Frame] = []
    for line in lines:
        if line.lstrip().startswith("Caused by:") and out:
            break
        m = _JAVA.match(line)
        if m is not None:
            owner = m[1].split("$", 1)[0]
            out.append(Frame(m[3], int(m[4] or 0), m[2], owner))
            if len(out) >= MAX_FRAMES:
                break
    return out
