"""The container image (Dockerfile, .dockerignore), checked without Docker: what its default target runs, as whom,
where it listens, that it can run repros, its labels, its health check against the daemon's real HTTP server, and
that the build context holds what the build copies."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from prometheus_client import CollectorRegistry

from streamer import cli, config
from streamer.config import HttpConfig
from streamer.runtime.http import HttpServer
from tests.deploy import dockerfile

ROOT = Path(__file__).resolve().parents[2]
STAGES = dockerfile.stages((ROOT / "Dockerfile").read_text())
DAEMON = dockerfile.chain(STAGES)  # the default target
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OCI = ("title", "description", "licenses", "version", "revision", "created")


def test_the_default_target_is_the_daemon() -> None:
    """`docker build .` builds the daemon; the shop (the demo's workload) is a separate target built on it."""
    assert [s.name for s in DAEMON] == ["base", "daemon"]
    assert [s.name for s in dockerfile.chain(STAGES, "shop")] == ["base", "shop"]


def test_runs_as_a_numeric_non_root_user() -> None:
    """USER is a numeric uid:gid other than 0 (Kubernetes' runAsNonRoot can only verify a number), the one created."""
    user = dockerfile.last(DAEMON, "USER")
    assert user == "10001:10001"
    run = " ".join(rest for s in DAEMON for op, rest in s.instructions if op == "RUN")
    assert "--uid 10001" in run and "--gid 10001" in run


def test_listens_on_all_interfaces_through_the_environment_not_the_default() -> None:
    """The image sets TRACE_REPRO_HTTP__HOST=0.0.0.0, a real setting that wins over the shipped file's 127.0.0.1;
    the daemon's own default stays 127.0.0.1."""
    env = dockerfile.env(DAEMON)
    assert env["TRACE_REPRO_HTTP__HOST"] == "0.0.0.0"
    settings = config.load(
        ROOT / "config" / "trace-repro.toml", {k: v for k, v in env.items() if k.startswith("TRACE_")}
    )
    assert settings.http.host == "0.0.0.0"
    assert HttpConfig().host == "127.0.0.1"
    assert str(settings.http.port) in {rest for s in DAEMON for op, rest in s.instructions if op == "EXPOSE"}


def test_installs_pytest_for_repros() -> None:
    """The package is installed with the `repro` extra, and that extra brings pytest (the repro worker runs the
    generated tests with ``python -m pytest``)."""
    run = " ".join(rest for s in DAEMON for op, rest in s.instructions if op == "RUN")
    assert '"${wheel}[repro]"' in run
    assert any(req.startswith("pytest") for req in PYPROJECT["project"]["optional-dependencies"]["repro"])


def test_the_entrypoint_and_command_are_the_cli() -> None:
    """ENTRYPOINT is the package's console script, CMD a command it accepts: run with the configuration the image
    copies in (the shipped one; mount yours over it)."""
    assert dockerfile.exec_form(dockerfile.last(DAEMON, "ENTRYPOINT") or "") == ["trace-repro"]
    assert PYPROJECT["project"]["scripts"]["trace-repro"] == "streamer.cli:main"
    args = cli.parser().parse_args(dockerfile.exec_form(dockerfile.last(DAEMON, "CMD") or ""))
    copies = {rest.split()[-1]: rest.split()[-2] for s in DAEMON for op, rest in s.instructions if op == "COPY"}
    assert args.command == "run" and str(args.config) in copies
    assert config.load(ROOT / copies[str(args.config)], {}).http.port == 9464


def test_oci_labels() -> None:
    """org.opencontainers.image.* labels; the version is the package's."""
    found = dockerfile.labels(DAEMON)
    assert {f"org.opencontainers.image.{k}" for k in OCI} <= set(found)
    args = {
        rest.partition("=")[0]: rest.partition("=")[2] for s in DAEMON for op, rest in s.instructions if op == "ARG"
    }
    assert found["org.opencontainers.image.version"] == "${VERSION}"
    assert args["VERSION"] == PYPROJECT["project"]["version"]
    assert found["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_healthcheck_asks_the_daemons_healthz() -> None:
    """The HEALTHCHECK command, run here, exits 0 against the daemon's own HTTP server and non-zero once it is gone."""
    healthcheck = dockerfile.last(DAEMON, "HEALTHCHECK") or ""
    argv = dockerfile.exec_form(healthcheck.split("CMD", 1)[1].strip())
    assert argv[0] == "python"

    async def probe() -> tuple[int, int]:
        server = HttpServer("127.0.0.1", 0, CollectorRegistry(), lambda: (True, ""))
        await server.start()
        env = {**os.environ, "TRACE_REPRO_HTTP__PORT": str(server.port)}
        up = await asyncio.to_thread(subprocess.run, [sys.executable, *argv[1:]], env=env, timeout=30, check=False)
        await server.stop()
        down = await asyncio.to_thread(subprocess.run, [sys.executable, *argv[1:]], env=env, timeout=30, check=False)
        return up.returncode, down.returncode

    up, down = asyncio.run(probe())
    assert up == 0 and down != 0


def test_the_build_context_holds_what_the_build_copies() -> None:
    """Every COPY source is in the build context (.dockerignore keeps it), and local state is not (.venv, .git,
    caches, the engines' addresses)."""
    patterns = dockerfile.ignore_patterns(ROOT / ".dockerignore")
    for stage in STAGES:
        for op, rest in stage.instructions:
            if op != "COPY" or rest.startswith("--from"):
                continue
            for source in rest.split()[:-1]:
                path = ROOT / source
                assert path.exists(), source
                files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
                tracked = [p for p in files if "__pycache__" not in p.parts]
                assert tracked and all(dockerfile.included(str(p.relative_to(ROOT)), patterns) for p in tracked), source
    for local in (".venv/bin/python", ".git/HEAD", "streamer/__pycache__/cli.cpython-311.pyc", ".engines.env",
                  "out/demo/daemon.log", "tests/conftest.py", "bench/demo.py"):  # fmt: skip
        assert not dockerfile.included(local, patterns), local
