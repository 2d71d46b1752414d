"""Kafka, Kafka Connect and Debezium jars, resolved from Maven Central once and cached.

The poms live in ``config/maven/``. Maven resolves them into its own local repository and copies the runtime
jars into ``<cache>/jars/<name>-<pom digest>/``; a complete copy is marked with a ``.complete`` file, so a
second start finds the jars and runs no Maven at all.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from streamer.engines.layout import Layout
from streamer.engines.process import EngineError


def require_java() -> str:
    """The ``java`` executable, or an error that says what to install."""
    java = shutil.which("java")
    if java is None:
        raise EngineError(
            "java not found: the local Kafka and Kafka Connect need a Java 17+ runtime "
            "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17)"
        )
    return java


def require_maven() -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise EngineError(
            "mvn not found: the local engines resolve Kafka and Debezium jars from Maven Central with Maven "
            "(Debian/Ubuntu: apt-get install maven; macOS: brew install maven)"
        )
    return mvn


def resolve(layout: Layout, pom_name: str, *, subdir: str = "") -> Path:
    """The directory holding the runtime jars of ``config/maven/<pom_name>``, resolving them if needed.

    With ``subdir`` the jars go one level down and the returned directory is their parent: the layout Kafka
    Connect's ``plugin.path`` expects (one folder per plugin).
    """
    pom = layout.config_dir / "maven" / pom_name
    if not pom.exists():
        raise EngineError(f"{pom} is missing: run from a checkout of trace-repro or set TRACE_REPRO_CONFIG_DIR")
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    target = layout.cache_dir / "jars" / f"{pom.stem}-{digest}"
    if (target / ".complete").exists():
        return target
    mvn = require_maven()
    require_java()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging / subdir}",
        "-DincludeScope=runtime",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise EngineError(f"Maven could not resolve {pom}:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    (staging / ".complete").write_text(digest)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target
