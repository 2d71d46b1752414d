"""What ``/proc`` says of a process and its descendants (Linux): CPU seconds, memory sizes, the process tree.

The bench, the soak and the workers' live tests measure the daemon from outside with these: a process's CPU
seconds and memory, and :class:`DaemonTree`, which samples a daemon and its workers while it runs.
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


def cpu_deltas(before: dict[str, float | None], after: dict[str, float | None], seconds: float) -> dict[str, float]:
    """CPU used per process over an interval, as a share of one core."""
    return {
        name: round(((after[name] or 0.0) - b) / seconds, 2)
        for name, b in before.items()
        if b is not None and after.get(name) is not None and seconds > 0
    }


class DaemonTree:
    """CPU and memory of the daemon and its workers, sampled while it runs (workers may come and go)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_mb: dict[int, float] = {}  # VmHWM per process, last seen
        self.cpu_s: dict[int, float] = {}  # CPU seconds per process, last seen
        self.peak_sum_rss_mb = 0.0  # the largest sum of VmRSS over the tree at one sample
        self.peak_sum_pss_mb = 0.0  # the same for PSS: a page shared by k processes counts 1/k in each
        self.peak_pss_mb: dict[int, float] = {}  # the largest PSS seen per process
        self.processes = 0

    def sample(self) -> None:
        pids = process_tree(self.pid)
        self.processes = max(self.processes, len(pids))
        total = pss_total = 0.0
        for p in pids:
            hwm, rss, cpu = proc_mb(p, "VmHWM"), proc_mb(p, "VmRSS"), proc_cpu_s(p)
            if hwm is not None:
                self.peak_mb[p] = hwm
            if cpu is not None:
                self.cpu_s[p] = cpu
            total += rss or 0.0
            pss = proc_mb(p, "Pss", "smaps_rollup") or 0.0
            self.peak_pss_mb[p] = max(self.peak_pss_mb.get(p, 0.0), pss)
            pss_total += pss
        self.peak_sum_rss_mb = max(self.peak_sum_rss_mb, total)
        self.peak_sum_pss_mb = max(self.peak_sum_pss_mb, pss_total)

    def cpu(self) -> float:
        return sum(self.cpu_s.values())
