"""Kafka, Kafka Connect and Debezium jars, resolved from Maven Central once and cached.

The poms live in ``config/maven/``. Maven (:mod:`streamer.engines.maven`, run on the JDK
:mod:`streamer.engines.jvm` chose) resolves them into its own local repository and copies the runtime jars into
``<cache>/jars/<name>-<pom digest>/``; a complete copy is marked with a ``.complete`` file, so a second start finds
the jars and runs neither Maven nor any download. Whichever Maven and JDK resolved them, the jars are the same.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from streamer.engines import download, jvm, maven, truststore
from streamer.engines.layout import Layout
from streamer.engines.process import EngineError


def require_java() -> jvm.Java:
    """The Java runtime for the engines and for Maven, or an error that says what to install."""
    return jvm.find()


def resolve(layout: Layout, pom_name: str, *, subdir: str = "") -> Path:
    """The directory holding the runtime jars of ``config/maven/<pom_name>``, resolving them if needed.

    With ``subdir`` the jars go one level down and the returned directory is their parent: the layout Kafka
    Connect's ``plugin.path`` expects (one folder per plugin).
    """
    pom = layout.config_dir / "maven" / pom_name
    if not pom.exists():
        raise EngineError(f"{pom} is missing: run from a checkout of trace-repro or set TRACE_REPRO_CONFIG_DIR")
    return resolve_pom(pom, layout.cache_dir, subdir=subdir)


def resolve_pom(pom: Path, cache_dir: Path, *, subdir: str = "") -> Path:
    """:func:`resolve` for a POM given by its path (e.g. a corpus service's), cached under ``cache_dir/jars``."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    target = cache_dir / "jars" / f"{pom.stem}-{digest}"
    if (target / ".complete").exists():
        return target
    java = require_java()
    mvn = maven.executable(cache_dir)
    staging = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    cmd = [
        str(mvn),
        "-q",
        "-B",
        "-f",
        str(pom),
        f"{maven.DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={staging / subdir}",
        "-DincludeScope=runtime",
    ]
    # Maven runs on the chosen JDK and trusts the machine's CAs (JDK_JAVA_OPTIONS, unlike MAVEN_OPTS, takes quoted
    # paths); options the user set come last and win.
    trust = " ".join(f'"{opt}"' for opt in truststore.java_options(cache_dir / "maven"))
    env = {
        **os.environ,
        "JAVA_HOME": str(java.home),
        "JDK_JAVA_OPTIONS": f"{trust} {os.environ.get('JDK_JAVA_OPTIONS', '')}",
    }
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if result.returncode != 0:
            raise EngineError(
                f"Maven ({mvn}, on {java.describe()}) could not resolve {pom}; the first start needs Maven Central "
                f"(or a mirror in ~/.m2/settings.xml), later ones use {target.parent}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-2000:]}"
            )
        download.publish(staging, target, digest)  # (another process may have resolved the same POM meanwhile)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
