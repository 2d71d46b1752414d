"""Apicurio Registry, the schema registry for Debezium's Avro form: a pinned release from Maven Central, run on the JDK.

``io.apicurio:apicurio-registry-app:<VERSION>:zip:all`` (a Quarkus runner jar and its ``lib/``) is downloaded once
into ``<cache>/apicurio/``, checked against the SHA-512 pinned here (the digest Central publishes next to it),
unpacked (the archive then removed), and started with in-memory storage on a free port. It serves its own API
(``/apis/registry/v2``) and the Confluent-compatible one (``/apis/ccompat/v7``) that the daemon's
``decode.schema_registry`` reads; Debezium writes to it through Apicurio's Kafka Connect converter
(``config/maven/apicurio-converter-pom.xml``, on the Connect worker's plugin path). It is started on demand
(``trace-repro local up --registry``, and by the tests that need it): a JVM and a large first download that most
runs have no use for.
"""

from __future__ import annotations

import os
import shutil
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

from streamer.engines import download, jars
from streamer.engines.connect import AVRO_CONVERTER
from streamer.engines.layout import Layout
from streamer.engines.maven import CENTRAL
from streamer.engines.process import EngineError, free_port, spawn, wait_until
from streamer.engines.state import EngineState

VERSION = "2.6.13.Final"
# apicurio-registry-app-<VERSION>-all.zip.sha512, as Central publishes it next to the archive.
SHA512 = (
    "fa82420a61b210ecfac4151329e193d6085065183136abd378c102ace691a405"
    "356f427b41060eaff87c8dc2383209a45986b6b71b6806a594a674cd5aa093b9"
)
RUNNER = f"apicurio-registry-app-{VERSION}-runner.jar"
CCOMPAT = "/apis/ccompat/v7"  # the Confluent-compatible API: what decode.schema_registry.url points at


def archive_url(repository: str = CENTRAL) -> str:
    return f"{repository}/io/apicurio/apicurio-registry-app/{VERSION}/apicurio-registry-app-{VERSION}-all.zip"


def install(cache_dir: Path, *, repository: str = CENTRAL, sha512: str = SHA512) -> Path:
    """The directory holding the runner jar and its ``lib/``, downloading and unpacking the release first if needed."""
    tools = cache_dir / "apicurio"
    home = tools / f"apicurio-registry-{VERSION}"
    if (home / ".complete").exists():
        return home
    tools.mkdir(parents=True, exist_ok=True)
    archive = tools / f"apicurio-registry-app-{VERSION}-all.zip"
    if not (archive.exists() and download.sha512_of(archive) == sha512):
        url = archive_url(repository)
        download.pinned(url, archive, sha512, unreachable=lambda reason: (
            f"could not download Apicurio Registry {VERSION} from {url}: {reason}. The local schema registry "
            f"(Debezium's Avro form) needs it once; it is then cached in {archive.parent}"))  # fmt: skip
    staging = tools / f".unpack-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():  # (the archive is pinned by digest; refuse escaping names all the same)
                if member.startswith("/") or ".." in Path(member).parts:
                    raise EngineError(f"{archive} holds an unsafe path {member!r}")
            zf.extractall(staging)
        if not (staging / RUNNER).is_file():
            raise EngineError(f"{archive} holds no {RUNNER}; delete it and try again")
        download.publish(staging, home, sha512)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink(missing_ok=True)  # unpacked and marked complete: the archive is not needed again
    return home


def start(layout: Layout, *, port: int | None = None) -> EngineState:
    """Start the registry (in-memory storage: its schemas last as long as the process) and wait until it answers."""
    home = install(layout.cache_dir)
    java = jars.require_java()
    port = port or free_port()
    base = layout.run_dir / "registry"
    base.mkdir(parents=True, exist_ok=True)
    log = layout.log_dir / "registry.log"
    argv = [str(java.executable), "-Xmx256m", "-XX:+UseSerialGC", f"-Dquarkus.http.port={port}",
            "-Dquarkus.http.host=127.0.0.1", "-jar", str(home / RUNNER)]  # fmt: skip
    pid = spawn(argv, log=log, cwd=base)
    state = EngineState("registry", pid, port, str(base), str(log), {"version": VERSION})
    wait_until(lambda: healthy(state), what="Apicurio Registry", timeout_s=120, pid=pid, log=log)
    return state


def url(state: EngineState) -> str:
    """The Confluent-compatible API root: ``decode.schema_registry.url`` and the converter's
    ``apicurio.registry.url`` take the native root (``native_url``)."""
    return f"http://127.0.0.1:{state.port}{CCOMPAT}"


def native_url(state: EngineState) -> str:
    return f"http://127.0.0.1:{state.port}/apis/registry/v2"


def healthy(state: EngineState) -> bool:
    try:
        with urllib.request.urlopen(f"{native_url(state)}/system/info", timeout=5) as resp:  # noqa: S310 - http URL
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def converter_config(state: EngineState) -> dict[str, str]:
    """A connector's ``key.converter``/``value.converter`` settings for Avro through this registry, in Confluent's
    framing (magic byte, 4-byte content id) so that any Confluent-compatible reader resolves the ids."""
    out: dict[str, str] = {}
    for side in ("key", "value"):
        out |= {
            f"{side}.converter": AVRO_CONVERTER,
            f"{side}.converter.apicurio.registry.url": native_url(state),
            f"{side}.converter.apicurio.registry.auto-register": "true",
            f"{side}.converter.apicurio.registry.find-latest": "true",
            f"{side}.converter.apicurio.registry.as-confluent": "true",
            f"{side}.converter.apicurio.registry.use-id": "contentId",
            f"{side}.converter.apicurio.registry.headers.enabled": "false",
        }
    return out
