"""The test Collector binary: compiled once from ``bench/collector/otelcol`` and kept in the cache.

``otelcol/`` is what the OpenTelemetry Collector Builder generates from ``builder-config.yaml`` (``main.go``,
``components.go``, ``go.mod`` and the committed ``go.sum``). :func:`binary` compiles it with ``go build -trimpath``
(``CGO_ENABLED=0``, ``-mod=readonly``: ``go.sum`` is the check of every module, never rewritten) into
``<cache>/otelcol-<release>-<digest>/otelcol``, the digest covering ``go.mod``, ``go.sum`` and the Go sources, and
returns that path at once when it is already there. Modules come from ``GOPROXY`` (the Go default, the Go module
proxy, unless the environment names another); the Go module and build caches are Go's own.

A file lock next to the binary makes concurrent callers (parallel test processes) build once: the others wait and
reuse it. The binary is written under a temporary name and renamed, so a half-written one is never used.
:func:`start_background` begins that work on a thread (at a lower CPU priority) as soon as a test session knows it
will need the Collector, so a cold build overlaps the engines' start and the tests that run before.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from bench.collector import toolchain
from streamer.engines import Layout
from streamer.engines.process import EngineError

RELEASE = "0.165.0"
BUILD_TIMEOUT_S = 1800  # a cold build downloads the modules and compiles everything
BACKGROUND_NICENESS = 10

_background: Future[Path] | None = None
_background_lock = threading.Lock()


def digest(module_dir: Path = toolchain.MODULE_DIR) -> str:
    """What the binary is built from: ``go.mod``, ``go.sum`` and every ``.go`` file, by name and content."""
    h = hashlib.sha256()
    for path in sorted([module_dir / "go.mod", module_dir / "go.sum", *module_dir.glob("*.go")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cached_path(cache_dir: Path | None = None) -> Path:
    """Where the binary for the current sources lives (whether or not it has been built)."""
    cache = cache_dir if cache_dir is not None else Layout.default().cache_dir
    return cache / f"otelcol-{RELEASE}-{digest()}" / "otelcol"


def start_background(cache_dir: Path | None = None) -> Future[Path]:
    """:func:`binary` on a daemon thread, started once per process; ``.result()`` waits for it (or re-raises)."""
    global _background
    with _background_lock:
        if _background is None:
            future: Future[Path] = Future()

            def run() -> None:
                try:
                    future.set_result(binary(cache_dir, niceness=BACKGROUND_NICENESS))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)

            threading.Thread(target=run, name="otelcol-build", daemon=True).start()
            _background = future
        return _background


def binary(cache_dir: Path | None = None, *, niceness: int = 0) -> Path:
    """The Collector binary for the current sources: the cached one, else built now (once, under a file lock)."""
    target = cached_path(cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder holds it until its binary is in place
        if not target.is_file():
            _build(target, niceness)
    return target


def _build(target: Path, niceness: int) -> None:
    go = toolchain.find()
    log = target.parent / "build.log"
    partial = target.with_name(f".otelcol.{os.getpid()}")
    flags = f"{os.environ.get('GOFLAGS', '')} -mod=readonly".strip()  # after the user's: the last -mod wins
    env = {**os.environ, **go.env(), "CGO_ENABLED": "0", "GOFLAGS": flags}
    argv = [str(go.executable), "build", "-trimpath", "-o", str(partial), "."]
    if niceness:
        argv = ["nice", "-n", str(niceness), *argv]
    started = time.monotonic()
    with open(log, "w") as out:
        out.write(f"# {go.describe()}: {' '.join(argv)}\n")
        out.flush()
        try:
            done = subprocess.run(
                argv,
                cwd=toolchain.MODULE_DIR,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EngineError(f"building the Collector took over {BUILD_TIMEOUT_S} s; see {log}") from exc
        out.write(f"# exit {done.returncode} after {time.monotonic() - started:.0f} s\n")
    if done.returncode != 0 or not partial.is_file():
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise EngineError(f"building the Collector with {go.describe()} failed (log: {log}):\n{tail}")
    partial.replace(target)
