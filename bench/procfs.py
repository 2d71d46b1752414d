"""What ``/proc`` says of a process and its descendants (Linux): CPU seconds, memory sizes, the process tree.

The bench, the soak and the workers' live tests measure the daemon from outside with these.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path


def proc_cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (None when unknown or gone)."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_mb(pid: int, key: str, file: str = "status") -> float | None:
    """A size in MB from ``/proc/PID/<file>`` (kB there): ``VmRSS`` or ``VmHWM`` of ``status``; ``Pss`` of
    ``smaps_rollup``, the proportional set size (each page shared with k processes counted 1/k). None if gone."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (the daemon's worker processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


async def terminate(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    """Stop a daemon the bench started: SIGTERM, then SIGKILL when it has not exited within ``timeout_s``."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), timeout_s)
    except TimeoutError:
        proc.kill()
        await proc.wait()
