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
The same machinery builds any small Go program kept in this repository as a module with a committed ``go.sum``
(:class:`GoProgram`): the Helm chart's checker (``deploy/helm/check``, :mod:`bench.chartcheck`) is one.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from bench.collector import toolchain
from streamer.engines import Layout
from streamer.engines.process import EngineError

RELEASE = "0.165.0"
BUILD_TIMEOUT_S = 1800  # a cold build downloads the modules and compiles everything
BACKGROUND_NICENESS = 10

_background: dict[str, Future[Path]] = {}
_background_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class GoProgram:
    """A Go module of this repository compiled into one cached binary: ``<cache>/<name>-<release>-<digest>/<name>``."""

    name: str
    module_dir: Path
    release: str
    what: str  # for messages: "the Collector"

    def digest(self) -> str:
        """What the binary is built from: ``go.mod``, ``go.sum`` and every ``.go`` file, by name and content."""
        h = hashlib.sha256()
        module_dir = self.module_dir
        for path in sorted([module_dir / "go.mod", module_dir / "go.sum", *module_dir.glob("*.go")]):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def cached_path(self, cache_dir: Path | None = None) -> Path:
        """Where the binary for the current sources lives (whether or not it has been built)."""
        cache = cache_dir if cache_dir is not None else Layout.default().cache_dir
        return cache / f"{self.name}-{self.release}-{self.digest()}" / self.name

    def start_background(self, cache_dir: Path | None = None) -> Future[Path]:
        """:meth:`binary` on a daemon thread, started once per process; ``.result()`` waits for it (or re-raises)."""
        with _background_lock:
            if self.name not in _background:
                future: Future[Path] = Future()

                def run() -> None:
                    try:
                        future.set_result(self.binary(cache_dir, niceness=BACKGROUND_NICENESS))
                    except BaseException as exc:  # handed to whoever waits on the future
                        future.set_exception(exc)

                threading.Thread(target=run, name=f"{self.name}-build", daemon=True).start()
                _background[self.name] = future
            return _background[self.name]

    def binary(self, cache_dir: Path | None = None, *, niceness: int = 0) -> Path:
        """The binary for the current sources: the cached one, else built now (once, under a file lock)."""
        target = self.cached_path(cache_dir)
        if target.is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent builder holds it until its binary is in place
            if not target.is_file():
                self._build(target, niceness)
        return target

    def _build(self, target: Path, niceness: int) -> None:
        go = toolchain.find(go_mod=self.module_dir / "go.mod")
        log = target.parent / "build.log"
        partial = target.with_name(f".{self.name}.{os.getpid()}")
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
                    cwd=self.module_dir,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=BUILD_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired as exc:
                raise EngineError(f"building {self.what} took over {BUILD_TIMEOUT_S} s; see {log}") from exc
            out.write(f"# exit {done.returncode} after {time.monotonic() - started:.0f} s\n")
        if done.returncode != 0 or not partial.is_file():
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
            raise EngineError(f"building {self.what} with {go.describe()} failed (log: {log}):\n{tail}")
        partial.replace(target)


COLLECTOR = GoProgram("otelcol", toolchain.MODULE_DIR, RELEASE, "the Collector")


def digest() -> str:
    """The Collector's source digest (:meth:`GoProgram.digest`)."""
    return COLLECTOR.digest()


def cached_path(cache_dir: Path | None = None) -> Path:
    """Where the Collector binary for the current sources lives (whether or not it has been built)."""
    return COLLECTOR.cached_path(cache_dir)


def start_background(cache_dir: Path | None = None) -> Future[Path]:
    """The Collector's :meth:`GoProgram.start_background`."""
    return COLLECTOR.start_background(cache_dir)


def binary(cache_dir: Path | None = None, *, niceness: int = 0) -> Path:
    """The Collector binary for the current sources: the cached one, else built now (once, under a file lock)."""
    return COLLECTOR.binary(cache_dir, niceness=niceness)
