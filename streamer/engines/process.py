"""Starting, probing and stopping the local engines' processes.

Engines run detached (their own session) so that ``trace-repro local up`` can return and leave them running;
their PIDs live in the state file and ``down`` stops them by PID: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


class EngineError(RuntimeError):
    """An engine could not be prepared, started or reached; the message says what to do."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def spawn(
    argv: Sequence[str],
    *,
    log: Path,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached, stdout and stderr appended to ``log``; returns the PID."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            user=user,
        )
    return proc.pid


def alive(pid: int) -> bool:
    """True when ``pid`` is a running process (a zombie child counts as dead)."""
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def stop(pid: int, *, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of ``pid``, wait up to ``grace_s``, then SIGKILL it."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def kill(pid: int, sig: int = signal.SIGKILL, *, wait_s: float = 10.0) -> None:
    """Send ``sig`` to the process group of ``pid`` at once (no grace period); for SIGKILL, wait until it is gone."""
    if not alive(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    if sig != signal.SIGKILL:
        return
    deadline = time.monotonic() + wait_s
    while alive(pid):
        if time.monotonic() > deadline:
            raise EngineError(f"process {pid} still alive {wait_s:.0f}s after SIGKILL")
        time.sleep(0.05)


def wait_until(
    probe: Callable[[], bool], *, what: str, timeout_s: float, pid: int | None = None, log: Path | None = None
) -> None:
    """Poll ``probe`` until it is true; fail early when ``pid`` died, naming the log to read."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        if probe():
            return
        if pid is not None and not alive(pid):
            raise EngineError(f"{what} exited during start-up{_tail(log)}")
        if time.monotonic() > deadline:
            raise EngineError(f"{what} not ready after {timeout_s:.0f}s{_tail(log)}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)


def _tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.exists():
        return ""
    text = log.read_text(errors="replace").splitlines()[-lines:]
    return f"; see {log}:\n" + "\n".join(text)
