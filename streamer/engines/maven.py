"""Apache Maven for resolving the engines' jars: a pinned distribution from Maven Central, fetched once.

The binary distribution (``org.apache.maven:apache-maven:<VERSION>:tar.gz:bin``) is downloaded into
``<cache>/maven/``, checked against the SHA-512 pinned here (the digest Central publishes next to the archive, so
a corrupt or substituted download is refused), unpacked, and run on the JDK :mod:`streamer.engines.jvm` chose.
A complete unpack is marked with ``.complete``; later runs use it without any network.

A system ``mvn`` is not used by default: one pinned Maven (and one pinned dependency plugin) everywhere means a
POM resolves to the same jars on every machine, which the jar cache (keyed by the POM's digest) relies on.
``TRACE_REPRO_MVN`` names another ``mvn`` to run instead, e.g. on an offline machine with a mirror configured.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path

from streamer.engines import download
from streamer.engines.process import EngineError

VERSION = "3.9.16"
# apache-maven-<VERSION>-bin.tar.gz.sha512, as Central publishes it next to the archive.
SHA512 = (
    "831a8591fe20c8243b1dbe7d71e3244f31d1665b0804b2e825e38cbbe5ce0caf"
    "b8338851f90780735568773e0a6cd07bbec107cda0b896b008b861075358b6f6"
)
CENTRAL = "https://repo.maven.apache.org/maven2"
# Pinned rather than left to Maven's default binding, which differs between Maven versions.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"


def archive_name(version: str = VERSION) -> str:
    return f"apache-maven-{version}-bin.tar.gz"


def archive_url(repository: str = CENTRAL, version: str = VERSION) -> str:
    return f"{repository}/org/apache/maven/apache-maven/{version}/{archive_name(version)}"


def executable(cache_dir: Path, env: Mapping[str, str] | None = None) -> Path:
    """The ``mvn`` to run: ``TRACE_REPRO_MVN`` when set, else the pinned distribution under ``cache_dir``."""
    env = os.environ if env is None else env
    explicit = env.get("TRACE_REPRO_MVN")
    if explicit:
        found = shutil.which(explicit, path=env.get("PATH", os.defpath))
        if found is None:
            raise EngineError(f"TRACE_REPRO_MVN={explicit} is not a runnable mvn")
        return Path(found)
    return bootstrap(cache_dir / "maven", env=env)


def bootstrap(
    tools_dir: Path, *, repository: str = CENTRAL, sha512: str = SHA512, env: Mapping[str, str] | None = None
) -> Path:
    """``bin/mvn`` of the pinned Maven under ``tools_dir``, downloading and unpacking it first if needed."""
    home = tools_dir / f"apache-maven-{VERSION}"
    mvn = home / "bin" / "mvn"
    if (home / ".complete").exists():
        return mvn
    tools_dir.mkdir(parents=True, exist_ok=True)
    archive = tools_dir / archive_name()
    if not (archive.exists() and download.sha512_of(archive) == sha512):
        url = archive_url(repository)
        explain = _unreachable(url, archive, os.environ if env is None else env)
        download.pinned(url, archive, sha512, unreachable=explain)
    staging = tools_dir / f".unpack-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        unpacked = staging / home.name
        if not (unpacked / "bin" / "mvn").is_file():
            raise EngineError(f"{archive} holds no {home.name}/bin/mvn; delete it and try again")
        (unpacked / ".complete").write_text(sha512)
        with contextlib.suppress(OSError):  # another process may have finished the same unpack first
            unpacked.rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not (home / ".complete").exists():
        raise EngineError(f"could not unpack {archive} into {home}")
    return mvn


def _unreachable(url: str, target: Path, env: Mapping[str, str]) -> Callable[[object], str]:
    def explain(reason: object) -> str:
        system = shutil.which("mvn", path=env.get("PATH", os.defpath))
        alternative = f", or set TRACE_REPRO_MVN={system} to use the Maven installed here" if system else ""
        return (
            f"could not download Apache Maven {VERSION} from {url}: {reason}. The local engines resolve the Kafka "
            f"and Debezium jars with it, and none is cached in {target.parent} yet: connect to the network once "
            f"(the download and the jars are then cached){alternative}"
        )

    return explain
